// Package all registers every protocol strata ships. Import it for its side
// effect when building stacks from configs that may name any of them.
package all

import (
	// Each protocol registers itself in init.
	_ "github.com/strata-go/strata/protocols/delay"
	_ "github.com/strata-go/strata/protocols/discard"
	_ "github.com/strata-go/strata/protocols/frag"
	_ "github.com/strata-go/strata/protocols/nakack"
	_ "github.com/strata-go/strata/protocols/sim"
	_ "github.com/strata-go/strata/protocols/stable"
	_ "github.com/strata-go/strata/protocols/udp"
	_ "github.com/strata-go/strata/protocols/unicast2"
)
