package diag_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/strata-go/strata/diag"
	"github.com/strata-go/strata/stack"
)

// An application exports a channel's counters in its own registry with one
// line.
func ExampleNewCollector() {
	ch, err := stack.New(stack.Shipped("sim.toml"), stack.WithName("A"),
		stack.WithVars(map[string]string{"STRATA_SIM_NETWORK": "example-collector"}))
	if err != nil {
		panic(err)
	}
	defer ch.Close()
	if err := ch.Connect(context.Background(), "demo"); err != nil {
		panic(err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(diag.NewCollector(ch)) // the one line

	fams, _ := reg.Gather()
	for _, f := range fams {
		if n := f.GetName(); n == "strata_view_size" || strings.HasPrefix(n, "strata_sim_msgs_sent") {
			m := f.Metric[0]
			fmt.Println(n, f.GetType(), m.Label[0].GetValue(), m.Label[1].GetValue())
		}
	}
	// Output:
	// strata_sim_msgs_sent_internal_total COUNTER demo A
	// strata_sim_msgs_sent_oob_total COUNTER demo A
	// strata_sim_msgs_sent_regular_total COUNTER demo A
	// strata_sim_msgs_sent_total COUNTER demo A
	// strata_view_size GAUGE demo A
}
