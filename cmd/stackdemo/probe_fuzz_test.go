package main

import (
	"encoding/json"
	"io"
	"testing"
	"time"

	"github.com/strata-go/strata/diag"
)

// FuzzProbeAnswers: whatever a member's endpoint answers (probe decodes
// /debug/strata from anything at the address it is given), comparing and
// printing the answers never panics.
func FuzzProbeAnswers(f *testing.F) {
	a := `{"member":"A","view":{"id":"[A|3]","creator":"A","seq":3,"coordinator":"A","size":2,"members":["A","B"]},"protocols":[{"name":"NAKACK","stats":{"retransmissions":4},"counters":["retransmissions"]}]}`
	b := `{"member":"B","view":{"id":"[A|2]","creator":"A","seq":2,"members":["A"]},"protocols":[{"name":"NAKACK","stats":{"retransmissions":9}},{"name":"GMS"}]}`
	f.Add([]byte(a), []byte(b))
	f.Add([]byte(a), []byte(`{}`))
	f.Add([]byte(`{"view":null,"protocols":[null]}`), []byte(`{"view":{"members":null}}`))
	f.Add([]byte(`[]`), []byte(`null`))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		var ms []probeMember
		for i, raw := range [][]byte{a, b} {
			m := probeMember{Endpoint: string(rune('a' + i))}
			var s diag.Snapshot
			if err := json.Unmarshal(raw, &s); err != nil {
				m.Error = err.Error()
			} else {
				m.Snapshot = &s
			}
			ms = append(ms, m)
		}
		compareViews(ms)
		r := &probeReport{Time: time.Unix(0, 0), Members: ms, Differ: differingStats(ms, true)}
		printReport(io.Discard, r)
		prev := &probeReport{Time: time.Unix(-1, 0), Members: ms}
		for i := range r.Differ {
			addRates(&r.Differ[i], prev, 1)
		}
	})
}
