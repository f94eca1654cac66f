// Package ufc is UFC: per-destination credit-based flow control for unicasts (JGroups' UFC).
// A sender holds max_credits bytes of credit per receiver and blocks
// without enough; receivers return credits once their application has
// processed min_threshold of them. INTERNAL and NO_FC messages pass freely.
// The logic, shared with the other flow-control layer, is in
// internal/flowcontrol.
package ufc

import (
	"github.com/strata-go/strata/internal/flowcontrol"
	"github.com/strata-go/strata/stack"
)

// Config configures UFC (max_credits, min_threshold, max_block_time).
type Config = flowcontrol.Config

// DefaultConfig returns UFC's defaults, those of JGroups' udp.xml.
func DefaultConfig() Config { return flowcontrol.DefaultConfig() }

// UFC is the UFC layer: a name applications and tests can use for
// what New returns (the logic lives in internal/flowcontrol, shared with
// the other flow-control layer).
type UFC = flowcontrol.FlowControl

// New returns a UFC layer.
func New(cfg Config) *UFC { return flowcontrol.New("UFC", false, cfg) }

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "UFC", ID: stack.IDUFC,
		Requires: []stack.Service{stack.ServiceMembership},
		Doc:      "per-destination credit-based flow control for unicasts (JGroups' UFC)",
		Defaults: DefaultConfig,
		New:      func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
	stack.RegisterHeader(stack.HeaderType{ID: stack.IDUFC, Name: "UFC", Decode: flowcontrol.DecodeHeader, Samples: flowcontrol.Samples})
}
