// Package diag lets an operator see inside a running channel: a Prometheus
// collector over its counters, a JSON snapshot of its view, members,
// protocols' config and counters, and an HTTP endpoint serving both and
// pprof. Importing it enables stack.WithDiag and a config's diag_addr.
//
// The endpoint is off unless an address is given, listens only there, and
// answers only HTTP requests to it: nothing is ever served to a multicast
// query, unlike JGroups' probe.
package diag

import (
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/strata-go/strata/stack"
)

// Collector exports a channel's counters as Prometheus metrics: every
// protocol stat as strata_<protocol>_<stat>_total (counters) or
// strata_<protocol>_<stat> (gauges), and the view, flow-control blocked
// time and traffic as strata_view_*, strata_blocked_seconds_total and
// strata_{sent,received}_{messages,bytes}_total; labels cluster and member.
// Each scrape reads the counters as they are, without stopping the stack.
type Collector struct {
	ch    *stack.Channel
	descs sync.Map // metric name -> *prometheus.Desc
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns a collector over ch's counters; register it in the
// application's registry with prometheus.MustRegister(diag.NewCollector(ch)).
func NewCollector(ch *stack.Channel) *Collector { return &Collector{ch: ch} }

// Describe sends nothing: the metrics follow the stack, whose layers can
// change at run time, so the collector is unchecked.
func (c *Collector) Describe(chan<- *prometheus.Desc) {}

var labelNames = []string{"cluster", "member"}

// Channel-level metrics, beside each protocol's.
const (
	metricViewID      = "strata_view_id"
	metricViewSize    = "strata_view_size"
	metricCoordinator = "strata_coordinator"
	metricBlocked     = "strata_blocked_seconds_total"
	metricSentMsgs    = "strata_sent_messages_total"
	metricRecvMsgs    = "strata_received_messages_total"
	metricSentBytes   = "strata_sent_bytes_total"
	metricRecvBytes   = "strata_received_bytes_total"
)

var channelHelp = map[string]string{
	metricViewID:      "sequence number of the member's current view (a member whose view lags has a lower one)",
	metricViewSize:    "members in the member's current view",
	metricCoordinator: "1 if the member coordinates its view, else 0",
	metricBlocked:     "seconds senders spent blocked in a layer (flow control: MFC, UFC; FLUSH)",
	metricSentMsgs:    "messages the transport sent",
	metricRecvMsgs:    "messages the transport received",
	metricSentBytes:   "payload bytes the transport sent, every lane",
	metricRecvBytes:   "payload bytes the transport received, every lane",
}

func (c *Collector) desc(name, help string, extra ...string) *prometheus.Desc {
	if d, ok := c.descs.Load(name); ok {
		return d.(*prometheus.Desc)
	}
	d, _ := c.descs.LoadOrStore(name, prometheus.NewDesc(name, help, append(labelNames[:len(labelNames):len(labelNames)], extra...), nil))
	return d.(*prometheus.Desc)
}

// Collect sends the current value of every metric.
func (c *Collector) Collect(out chan<- prometheus.Metric) {
	cluster, member := c.ch.Cluster(), c.ch.Address().String()
	gauge := func(name string, v float64, extra ...string) {
		out <- prometheus.MustNewConstMetric(c.desc(name, channelHelp[name], extraNames(extra)...), prometheus.GaugeValue, v, append([]string{cluster, member}, extraValues(extra)...)...)
	}
	counter := func(name string, v float64, extra ...string) {
		out <- prometheus.MustNewConstMetric(c.desc(name, channelHelp[name], extraNames(extra)...), prometheus.CounterValue, v, append([]string{cluster, member}, extraValues(extra)...)...)
	}
	if v := c.ch.View(); v != nil {
		gauge(metricViewID, float64(v.ID.Seq))
		gauge(metricViewSize, float64(v.Size()))
		coord := 0.0
		if v.Coordinator() == c.ch.Address() {
			coord = 1
		}
		gauge(metricCoordinator, coord)
	}
	seen := map[string]int{}
	for i, ps := range c.ch.Stats() {
		prefix := MetricPrefix(ps.Protocol)
		if n := seen[prefix]; n > 0 { // the same protocol twice in a stack
			seen[prefix] = n + 1
			prefix += "_" + strconv.Itoa(n+1)
		} else {
			seen[prefix] = 1
		}
		var bytesSent, bytesRecv int64
		for _, s := range ps.Stats {
			name, kind, help := prefix+"_"+sanitize(s.Name), prometheus.GaugeValue, ps.Protocol+" "+s.Name+" (gauge)"
			if s.Counter {
				name, kind, help = name+"_total", prometheus.CounterValue, ps.Protocol+" "+s.Name+" (counter)"
			}
			out <- prometheus.MustNewConstMetric(c.desc(name, help), kind, float64(s.Value), cluster, member)
			switch {
			case s.Name == "blocked_time_ns":
				counter(metricBlocked, float64(s.Value)/1e9, "protocol", ps.Protocol)
			case i > 0:
			case s.Name == "msgs_sent":
				counter(metricSentMsgs, float64(s.Value))
			case s.Name == "msgs_received":
				counter(metricRecvMsgs, float64(s.Value))
			case strings.HasPrefix(s.Name, "bytes_sent_"):
				bytesSent += s.Value
			case strings.HasPrefix(s.Name, "bytes_received_"):
				bytesRecv += s.Value
			}
		}
		if i == 0 { // the transport
			counter(metricSentBytes, float64(bytesSent))
			counter(metricRecvBytes, float64(bytesRecv))
		}
	}
}

// extraNames and extraValues split name, value pairs of extra labels.
func extraNames(kv []string) []string {
	var out []string
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, kv[i])
	}
	return out
}

func extraValues(kv []string) []string {
	var out []string
	for i := 1; i < len(kv); i += 2 {
		out = append(out, kv[i])
	}
	return out
}

// MetricPrefix is strata_ and the protocol's name in lower case, with
// anything but letters, digits and _ replaced by _ ("FD_ALL":
// "strata_fd_all").
func MetricPrefix(protocol string) string { return "strata_" + sanitize(protocol) }

// MetricName is the Prometheus name of a protocol's stat:
// strata_<protocol>_<stat>_total for a counter, strata_<protocol>_<stat>
// for a gauge.
func MetricName(protocol string, s stack.Stat) string {
	name := MetricPrefix(protocol) + "_" + sanitize(s.Name)
	if s.Counter {
		name += "_total"
	}
	return name
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_':
			return r
		case r >= 'A' && r <= 'Z':
			return r - 'A' + 'a'
		}
		return '_'
	}, s)
}
