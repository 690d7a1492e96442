package metrics

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler returns an http.Handler that serves, in the Prometheus exposition formats, c's metrics
// and those of more (such as a KafkaCollector) together with the Go runtime's (go_*) and the
// process's (process_*), from a registry of its own. It serves whatever path it is mounted on.
func Handler(c *Collector, more ...prometheus.Collector) (http.Handler, error) {
	if c == nil {
		return nil, ErrNoStream
	}
	reg := prometheus.NewRegistry()
	for _, col := range append([]prometheus.Collector{
		c,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	}, more...) {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}

// Server serves metrics over HTTP on /metrics and nothing else (every other path is 404).
type Server struct {
	ln   net.Listener
	srv  *http.Server
	done chan struct{}
	err  error // of Serve, once done is closed

	once     sync.Once
	closeErr error
}

// Listen listens on addr (host:port; port 0 picks a free one, see Addr) and serves h on /metrics
// in a goroutine of its own until Close.
func Listen(addr string, h http.Handler) (*Server, error) {
	if h == nil {
		return nil, errors.New("metrics: no handler")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	s := &Server{
		ln:   ln,
		srv:  &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.err = err
		}
	}()
	return s, nil
}

// Addr returns the address the server listens on, with the port it got.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops listening, lets the scrapes in progress finish until ctx ends (then closes their
// connections), and waits for the serving goroutine. It returns the error that stopped serving,
// if any. Safe to call twice.
func (s *Server) Close(ctx context.Context) error {
	s.once.Do(func() {
		err := s.srv.Shutdown(ctx)
		if err != nil {
			s.srv.Close()
		}
		<-s.done
		s.closeErr = errors.Join(err, s.err)
	})
	return s.closeErr
}

// Serve serves the metrics of s, labelled as opts says, on addr (see Listen): New, Handler and
// Listen in one call.
func Serve(addr string, s Source, opts Options) (*Server, error) {
	c, err := New(s, opts)
	if err != nil {
		return nil, err
	}
	h, err := Handler(c)
	if err != nil {
		return nil, err
	}
	return Listen(addr, h)
}
