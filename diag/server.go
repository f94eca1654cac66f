package diag

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/strata-go/strata/stack"
)

func init() {
	stack.RegisterDiag(func(ch *stack.Channel, addr string) (stack.DiagServer, error) { return Listen(ch, addr) })
}

// Handler serves ch's diagnostics: /metrics (Prometheus text, ch's
// counters and the Go runtime's), /debug/strata (Snapshot as JSON) and
// /debug/pprof/. An application with its own HTTP server can mount it
// instead of using stack.WithDiag.
func Handler(ch *stack.Channel) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(ch), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("GET /debug/strata", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(Take(ch))
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "strata diagnostics of %s in %s\n/metrics\n/debug/strata\n/debug/pprof/\n", ch.Address(), ch.Cluster())
	})
	return mux
}

// Server is a channel's diagnostics endpoint: an HTTP listener serving
// Handler. Close stops it and waits for its goroutines.
type Server struct {
	ln     net.Listener
	srv    *http.Server
	cancel context.CancelFunc
	serve  sync.WaitGroup // the accept loop
	conns  sync.WaitGroup // one per connection, until it is closed
	once   sync.Once
	err    error
}

var _ stack.DiagServer = (*Server)(nil)

// Listen serves ch's diagnostics on addr (host:port; port 0 picks a free
// one) until Close. stack.WithDiag and diag_addr call it through New.
func Listen(ch *stack.Channel, addr string) (*Server, error) {
	if err := stack.CheckDiagAddr(addr); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{ln: ln, cancel: cancel}
	s.srv = &http.Server{
		Handler:           Handler(ch),
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ConnState: func(_ net.Conn, st http.ConnState) {
			switch st {
			case http.StateNew:
				s.conns.Add(1)
			case http.StateClosed, http.StateHijacked:
				s.conns.Done()
			}
		},
	}
	s.serve.Go(func() { _ = s.srv.Serve(ln) })
	return s, nil
}

// Addr returns the address the endpoint listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Close stops listening, ends the requests in progress (a pprof profile
// included) and returns when every goroutine of the endpoint has exited.
func (s *Server) Close() error {
	s.once.Do(func() {
		s.cancel()
		s.err = s.srv.Close()
		s.serve.Wait()
		s.conns.Wait()
	})
	return s.err
}
