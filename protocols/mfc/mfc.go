// Package mfc is MFC: credit-based flow control for multicasts: a multicast waits for credits at every member (JGroups' MFC).
// A sender holds max_credits bytes of credit per receiver and blocks
// without enough; receivers return credits once their application has
// processed min_threshold of them. INTERNAL and NO_FC messages pass freely.
// The logic, shared with the other flow-control layer, is in
// internal/flowcontrol.
package mfc

import (
	"github.com/strata-go/strata/internal/flowcontrol"
	"github.com/strata-go/strata/stack"
)

// Config configures MFC (max_credits, min_threshold, max_block_time).
type Config = flowcontrol.Config

// DefaultConfig returns MFC's defaults, those of JGroups' udp.xml.
func DefaultConfig() Config { return flowcontrol.DefaultConfig() }

// MFC is the MFC layer: a name applications and tests can use for
// what New returns (the logic lives in internal/flowcontrol, shared with
// the other flow-control layer).
type MFC = flowcontrol.FlowControl

// New returns a MFC layer.
func New(cfg Config) *MFC { return flowcontrol.New("MFC", true, cfg) }

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "MFC", ID: stack.IDMFC,
		Requires: []stack.Service{stack.ServiceMembership},
		Doc:      "credit-based flow control for multicasts: a multicast waits for credits at every member (JGroups' MFC)",
		Defaults: DefaultConfig,
		New:      func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
	stack.RegisterHeader(stack.HeaderType{ID: stack.IDMFC, Name: "MFC", Decode: flowcontrol.DecodeHeader, Samples: flowcontrol.Samples})
}
