package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/strata-go/strata/diag"
	"github.com/strata-go/strata/stack"
)

// probeMember is one endpoint's answer.
type probeMember struct {
	Endpoint string         `json:"endpoint"`
	Error    string         `json:"error,omitempty"`
	Snapshot *diag.Snapshot `json:"snapshot,omitempty"`
	// ViewLags: another member has a newer view from the same creator
	// (this one missed a view); ViewDiffers: otherwise, fewer members have
	// this view than another (a partition, or a view still on its way).
	ViewLags    bool `json:"view_lags"`
	ViewDiffers bool `json:"view_differs"`
}

// probeRow is one counter whose values differ between the members.
type probeRow struct {
	Protocol string   `json:"protocol"`
	Stat     string   `json:"stat"`
	Counter  bool     `json:"counter"`
	Values   []*int64 `json:"values"`          // per member, nil where it has none
	Rates    []*int64 `json:"rates,omitempty"` // per second since the last probe (-watch)
}

// probeReport is what probe prints: each member, and the counters that
// differ between them, in stack order.
type probeReport struct {
	Time    time.Time     `json:"time"`
	Members []probeMember `json:"members"`
	Differ  []probeRow    `json:"differ"`
}

func cmdProbe(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("probe", flag.ContinueOnError)
	fl.SetOutput(stderr)
	asJSON := fl.Bool("json", false, "print the report (with every member's snapshot) as JSON")
	watch := fl.Bool("watch", false, "probe again every second, showing what changed per second, until interrupted")
	all := fl.Bool("all", false, "show every counter, not only those that differ between members")
	timeout := fl.Duration("timeout", 2*time.Second, "how long to wait for each member's answer")
	if err := fl.Parse(args); err != nil {
		return exitConfig
	}
	addrs := fl.Args()
	if len(addrs) == 0 {
		fmt.Fprintln(stderr, "stackdemo probe: give one or more diagnostics endpoints (host:port, as chat and perf print with -diag)")
		return exitConfig
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	client := &http.Client{Timeout: *timeout}
	var prev *probeReport
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		r := probe(ctx, client, addrs, prev, *all)
		if *asJSON {
			enc := json.NewEncoder(stdout)
			if !*watch {
				enc.SetIndent("", "  ")
			}
			_ = enc.Encode(r)
		} else {
			if *watch {
				fmt.Fprint(stdout, "\033[H\033[2J")
			}
			printReport(stdout, r)
		}
		if !*watch {
			for _, m := range r.Members {
				if m.Error != "" {
					return exitFail
				}
			}
			return exitOK
		}
		prev = r
		select {
		case <-ctx.Done():
			return exitOK
		case <-tick.C:
		}
	}
}

// probe asks every endpoint at once and compares the answers.
func probe(ctx context.Context, client *http.Client, addrs []string, prev *probeReport, all bool) *probeReport {
	r := &probeReport{Time: time.Now(), Members: make([]probeMember, len(addrs))}
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Go(func() {
			r.Members[i].Endpoint = a
			s, err := diag.Fetch(ctx, client, a)
			if err != nil {
				r.Members[i].Error = err.Error()
				return
			}
			r.Members[i].Snapshot = s
		})
	}
	wg.Wait()
	compareViews(r.Members)
	r.Differ = differingStats(r.Members, all)
	if prev != nil && len(prev.Members) == len(r.Members) {
		secs := r.Time.Sub(prev.Time).Seconds()
		for i := range r.Differ {
			addRates(&r.Differ[i], prev, secs)
		}
	}
	return r
}

// compareViews marks members whose view lags another's (same creator,
// lower seqno) and, among the others, those whose view is not the one
// most members have (a partition, or a view still on its way).
func compareViews(ms []probeMember) {
	holders := map[string]int{}
	most := 0
	for _, m := range ms {
		if m.Snapshot != nil && m.Snapshot.View != nil {
			holders[m.Snapshot.View.ID]++
			most = max(most, holders[m.Snapshot.View.ID])
		}
	}
	for i := range ms {
		a := ms[i].Snapshot
		if a == nil || a.View == nil {
			continue
		}
		for j := range ms {
			b := ms[j].Snapshot
			if i != j && b != nil && b.View != nil && a.View.Creator == b.View.Creator && a.View.Seq < b.View.Seq {
				ms[i].ViewLags = true
			}
		}
		ms[i].ViewDiffers = !ms[i].ViewLags && (holders[a.View.ID] < most || len(holders) > 1 && holders[a.View.ID] == most && tied(holders, most))
	}
}

// tied reports whether more than one view is held by most members.
func tied(holders map[string]int, most int) bool {
	n := 0
	for _, h := range holders {
		if h == most {
			n++
		}
	}
	return n > 1
}

// differingStats lists, in stack order, the stats whose values are not
// the same at every member that answered (every stat with all).
func differingStats(ms []probeMember, all bool) []probeRow {
	type key struct{ proto, stat string }
	var order []key
	rows := map[key]*probeRow{}
	for i, m := range ms {
		if m.Snapshot == nil {
			continue
		}
		seen := map[string]int{}
		for _, p := range m.Snapshot.Protocols {
			proto := p.Name
			if n := seen[p.Name]; n > 0 {
				proto = fmt.Sprintf("%s#%d", p.Name, n+1)
			}
			seen[p.Name]++
			names := make([]string, 0, len(p.Stats))
			for n := range p.Stats {
				names = append(names, n)
			}
			slices.Sort(names)
			for _, n := range names {
				k := key{proto, n}
				row := rows[k]
				if row == nil {
					row = &probeRow{Protocol: proto, Stat: n, Counter: slices.Contains(p.Counters, n), Values: make([]*int64, len(ms))}
					rows[k] = row
					order = append(order, k)
				}
				v := p.Stats[n]
				row.Values[i] = &v
			}
		}
	}
	var out []probeRow
	for _, k := range order {
		row := rows[k]
		same := true
		var first *int64
		for i, v := range row.Values {
			if ms[i].Snapshot == nil {
				continue
			}
			switch {
			case v == nil:
				same = false
			case first == nil:
				first = v
			case *v != *first:
				same = false
			}
		}
		if all || !same {
			out = append(out, *row)
		}
	}
	return out
}

// addRates sets row's per-second change of each counter since prev.
func addRates(row *probeRow, prev *probeReport, secs float64) {
	if !row.Counter || secs <= 0 {
		return
	}
	for i, v := range row.Values {
		old := prevValue(prev, i, row.Protocol, row.Stat)
		if v == nil || old == nil {
			continue
		}
		if row.Rates == nil {
			row.Rates = make([]*int64, len(row.Values))
		}
		r := int64(float64(*v-*old)/secs + 0.5)
		row.Rates[i] = &r
	}
}

func prevValue(prev *probeReport, member int, proto, stat string) *int64 {
	s := prev.Members[member].Snapshot
	if s == nil {
		return nil
	}
	name, nth := proto, 1
	if p, n, ok := strings.Cut(proto, "#"); ok {
		name = p
		_, _ = fmt.Sscan(n, &nth)
	}
	for _, p := range s.Protocols {
		if p.Name != name {
			continue
		}
		if nth--; nth > 0 {
			continue
		}
		if v, ok := p.Stats[stat]; ok {
			return &v
		}
		return nil
	}
	return nil
}

// printReport prints the members side by side: view, coordinator and the
// counters that differ, with the change per second under -watch.
func printReport(w io.Writer, r *probeReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(label string, cell func(i int, m probeMember) string) {
		fmt.Fprint(tw, label)
		for i, m := range r.Members {
			c := "-"
			if m.Snapshot != nil {
				c = cell(i, m)
			} else if label == "member" {
				c = "DOWN"
			}
			fmt.Fprint(tw, "\t", c)
		}
		fmt.Fprintln(tw)
	}
	fmt.Fprintf(tw, "probe %s\n", r.Time.Format("15:04:05"))
	fmt.Fprint(tw, "endpoint")
	for _, m := range r.Members {
		fmt.Fprint(tw, "\t", m.Endpoint)
	}
	fmt.Fprintln(tw)
	row("member", func(_ int, m probeMember) string { return m.Snapshot.Member })
	row("physical", func(_ int, m probeMember) string { return m.Snapshot.Physical })
	row("cluster", func(_ int, m probeMember) string { return m.Snapshot.Cluster })
	row("view", func(_ int, m probeMember) string {
		s := m.Snapshot
		if s.View == nil {
			return "not connected"
		}
		v := fmt.Sprintf("%s (%d)", s.View.ID, s.View.Size)
		switch {
		case m.ViewLags:
			v += " LAGS"
		case m.ViewDiffers:
			v += " DIFFERS"
		}
		return v
	})
	row("coordinator", func(_ int, m probeMember) string {
		s := m.Snapshot
		if s.View == nil {
			return "-"
		}
		if s.Coordinator {
			return s.View.Coordinator + " (self)"
		}
		return s.View.Coordinator
	})
	row("members", func(_ int, m probeMember) string {
		if m.Snapshot.View == nil {
			return "-"
		}
		return strings.Join(m.Snapshot.View.Members, ",")
	})
	proto := ""
	for _, d := range r.Differ {
		if d.Protocol != proto {
			proto = d.Protocol
			fmt.Fprintln(tw, proto)
		}
		fmt.Fprint(tw, "  ", d.Stat)
		for i, v := range d.Values {
			c := "-"
			if v != nil {
				c = fmt.Sprint(*v)
				if d.Rates != nil && d.Rates[i] != nil && *d.Rates[i] != 0 {
					c += fmt.Sprintf(" (%+d/s)", *d.Rates[i])
				}
			}
			fmt.Fprint(tw, "\t", c)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	for _, m := range r.Members {
		if m.Error != "" {
			fmt.Fprintf(w, "%s: %s\n", m.Endpoint, m.Error)
		}
	}
}

// withDiag adds WithDiag(addr) to opts when -diag is given; without it
// the config's diag_addr holds.
func withDiag(addr string, opts ...stack.Option) []stack.Option {
	if addr != "" {
		opts = append(opts, stack.WithDiag(addr))
	}
	return opts
}

// nthDiagAddr is member i's diagnostics address under perf -diag
// host:port: host:port+i (port 0: a free port each).
func nthDiagAddr(addr string, i int) (string, error) {
	if addr == "" {
		return "", nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("-diag %q: want host:port", addr)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p+i > 65535 {
		return "", fmt.Errorf("-diag %q: want a port number", addr)
	}
	if p == 0 {
		return addr, nil
	}
	return net.JoinHostPort(host, strconv.Itoa(p+i)), nil
}

// printDiag says where a member serves its diagnostics, if it does.
func printDiag(w io.Writer, ch *stack.Channel) {
	if a := ch.DiagAddr(); a != nil {
		fmt.Fprintf(w, "%s: diagnostics on http://%s/ (stackdemo probe %s)\n", ch.Name(), a, a)
	}
}
