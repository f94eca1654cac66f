// Package all registers every protocol strata ships. Import it for its side
// effect when building stacks from configs that may name any of them.
package all

import (
	// Each protocol registers itself in init.
	_ "github.com/strata-go/strata/protocols/auth"
	_ "github.com/strata-go/strata/protocols/compress"
	_ "github.com/strata-go/strata/protocols/delay"
	_ "github.com/strata-go/strata/protocols/discard"
	_ "github.com/strata-go/strata/protocols/encrypt"
	_ "github.com/strata-go/strata/protocols/fdall"
	_ "github.com/strata-go/strata/protocols/flush"
	_ "github.com/strata-go/strata/protocols/frag"
	_ "github.com/strata-go/strata/protocols/gms"
	_ "github.com/strata-go/strata/protocols/groupfc"
	_ "github.com/strata-go/strata/protocols/merge3"
	_ "github.com/strata-go/strata/protocols/mfc"
	_ "github.com/strata-go/strata/protocols/nakack"
	_ "github.com/strata-go/strata/protocols/ping"
	_ "github.com/strata-go/strata/protocols/sim"
	_ "github.com/strata-go/strata/protocols/stable"
	_ "github.com/strata-go/strata/protocols/statetransfer"
	_ "github.com/strata-go/strata/protocols/tcp"
	_ "github.com/strata-go/strata/protocols/udp"
	_ "github.com/strata-go/strata/protocols/ufc"
	_ "github.com/strata-go/strata/protocols/unicast2"
	_ "github.com/strata-go/strata/protocols/verifysuspect"
)
