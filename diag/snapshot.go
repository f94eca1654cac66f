package diag

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"time"

	"github.com/strata-go/strata/stack"
)

// Snapshot is what /debug/strata answers: one member's view of its group
// and its stack, as JSON. stackdemo probe reads it.
type Snapshot struct {
	Time        time.Time  `json:"time"`
	Cluster     string     `json:"cluster"`
	Member      string     `json:"member"` // logical name, or the address's UUID
	Address     string     `json:"address"`
	Physical    string     `json:"physical,omitempty"`
	Connected   bool       `json:"connected"`
	View        *View      `json:"view,omitempty"`
	Coordinator bool       `json:"coordinator"`
	Members     []Member   `json:"members,omitempty"`
	Protocols   []Protocol `json:"protocols"`
}

// View is a view as Snapshot shows it.
type View struct {
	ID          string   `json:"id"` // [creator|seq]
	Creator     string   `json:"creator"`
	Seq         uint64   `json:"seq"`
	Coordinator string   `json:"coordinator"`
	Size        int      `json:"size"`
	Members     []string `json:"members"`
}

// Member is a view member and the network address the transport knows for
// it ("" when it knows none, or has none, as SIM).
type Member struct {
	Name     string `json:"name"`
	UUID     string `json:"uuid"`
	Physical string `json:"physical,omitempty"`
}

// Protocol is one layer, bottom first: its config values (every key, as
// the config file writes them) and its counters and gauges.
type Protocol struct {
	Name     string            `json:"name"`
	Config   map[string]string `json:"config,omitempty"`
	Stats    map[string]int64  `json:"stats,omitempty"`
	Counters []string          `json:"counters,omitempty"` // the stats that are counters; the others are gauges
}

// Take reads ch's snapshot now, without stopping its stack.
func Take(ch *stack.Channel) *Snapshot {
	s := &Snapshot{
		Time: time.Now().UTC(), Cluster: ch.Cluster(), Member: ch.Address().String(),
		Address: ch.Address().UUID().String(), Physical: physical(ch, stack.Address{}),
	}
	if v := ch.View(); v != nil {
		s.Connected = true
		s.View = &View{ID: v.ID.String(), Creator: v.ID.Creator.String(), Seq: v.ID.Seq,
			Coordinator: v.Coordinator().String(), Size: v.Size()}
		s.Coordinator = v.Coordinator() == ch.Address()
		for _, m := range v.Members {
			s.View.Members = append(s.View.Members, m.String())
			s.Members = append(s.Members, Member{Name: m.String(), UUID: m.UUID().String(), Physical: physical(ch, m)})
		}
	}
	for _, p := range stack.Of(ch).Protocols() {
		lp := Protocol{Name: p.Name()}
		for _, set := range stack.Settings(p) {
			if lp.Config == nil {
				lp.Config = map[string]string{}
			}
			lp.Config[set.Key] = set.Value
		}
		var ss []stack.Stat
		if r, ok := p.(stack.StatsReporter); ok {
			ss = r.Stats()
		}
		for _, st := range ss {
			if lp.Stats == nil {
				lp.Stats = map[string]int64{}
			}
			lp.Stats[st.Name] = st.Value
			if st.Counter {
				lp.Counters = append(lp.Counters, st.Name)
			}
		}
		s.Protocols = append(s.Protocols, lp)
	}
	return s
}

// physical asks the transport for m's network address (zero m: this
// member's own).
func physical(ch *stack.Channel, m stack.Address) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var ap netip.AddrPort
	var err error
	if m.IsZero() {
		ap, err = stack.Ask(ctx, stack.Of(ch), stack.EvGetLocalPhysicalAddress{})
	} else {
		ap, err = stack.Ask(ctx, stack.Of(ch), stack.EvGetPhysicalAddress{Member: m})
	}
	if err != nil || !ap.IsValid() {
		return ""
	}
	return ap.String()
}

// Fetch asks the endpoint at addr (host:port, or a URL) for its snapshot.
func Fetch(ctx context.Context, client *http.Client, addr string) (*Snapshot, error) {
	url := addr
	if len(url) < 7 || (url[:7] != "http://" && (len(url) < 8 || url[:8] != "https://")) {
		url = "http://" + addr
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/debug/strata", nil)
	if err != nil {
		return nil, err
	}
	rsp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer rsp.Body.Close()
	if rsp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, rsp.Status)
	}
	var s Snapshot
	if err := json.NewDecoder(io.LimitReader(rsp.Body, 16<<20)).Decode(&s); err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	return &s, nil
}
