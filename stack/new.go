package stack

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"

	"github.com/strata-go/strata/configs"
)

// Option configures New: where the stack comes from (FromFile, FromFS,
// FromConfig, FromProtocols; the default stack without one) and the
// channel's name, logger, seed and receiver.
type Option func(*options)

type options struct {
	source   func(vars map[string]string) (*built, error)
	sources  int
	vars     map[string]string
	name     string
	logger   *slog.Logger
	seed     uint64
	seeded   bool
	receiver Receiver
	diag     *string
}

// built is what a stack option gives New: the layers and the config's
// diagnostics address.
type built struct {
	protos []Protocol
	diag   string
}

// FromFile takes the stack from a TOML stack config file.
func FromFile(path string) Option {
	return fromBytes(path, func() ([]byte, error) { return os.ReadFile(path) })
}

// FromFS takes the stack from the TOML config at path in fsys, for example
// one of the shipped configs embedded in configs.FS.
func FromFS(fsys fs.FS, path string) Option {
	return fromBytes(path, func() ([]byte, error) { return fs.ReadFile(fsys, path) })
}

// fromBytes takes the stack from the config read reads, named file.
func fromBytes(file string, read func() ([]byte, error)) Option {
	return source(func(vars map[string]string) (*built, error) {
		data, err := read()
		if err != nil {
			return nil, &ConfigError{File: file, Reason: err.Error()}
		}
		sc, err := ParseConfigVars(file, data, vars)
		if err != nil {
			return nil, err
		}
		return buildConfig(sc)
	})
}

// Shipped takes one of the stacks shipped in configs ("udp.toml",
// "flush.toml", "groupfc.toml", "secure.toml", "sim.toml"...), embedded in
// the program: no file is read at run time.
func Shipped(name string) Option { return FromFS(configs.FS, name) }

// FromConfig takes the stack from a parsed stack config.
func FromConfig(sc *StackConfig) Option {
	return source(func(map[string]string) (*built, error) { return buildConfig(sc) })
}

func buildConfig(sc *StackConfig) (*built, error) {
	protos, err := sc.Build()
	if err != nil {
		return nil, err
	}
	return &built{protos: protos, diag: sc.DiagAddr}, nil
}

// FromProtocols takes the stack from protocols built in code (NewProtocol),
// transport first.
func FromProtocols(protos ...Protocol) Option {
	return source(func(map[string]string) (*built, error) { return &built{protos: protos}, nil })
}

func source(f func(map[string]string) (*built, error)) Option {
	return func(o *options) { o.source, o.sources = f, o.sources+1 }
}

// WithVars gives a config's ${NAME} variables values that take precedence
// over the environment (FromFile, FromFS, Shipped and the default stack).
func WithVars(vars map[string]string) Option { return func(o *options) { o.vars = vars } }

// WithName sets the member's logical name (shown in views and logs).
func WithName(name string) Option { return func(o *options) { o.name = name } }

// WithLogger sets the logger of the channel's stack.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithSeed seeds the stack's random choices and the channel's addresses,
// so that a run over SIM in virtual time can be replayed from its seed.
func WithSeed(seed uint64) Option { return func(o *options) { o.seed, o.seeded = seed, true } }

// WithReceiver sets the receiver before anything can be delivered.
func WithReceiver(r Receiver) Option { return func(o *options) { o.receiver = r } }

// New builds a channel, ready to Connect. Without a stack option it runs
// the default stack (Shipped(configs.Default): UDP with IP multicast on
// 127.0.0.1, or on STRATA_BIND_ADDR), whose protocols a program registers
// by importing protocols/all.
func New(opts ...Option) (*Channel, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	switch {
	case o.sources > 1:
		return nil, errors.New("strata: New: more than one stack given (FromFile, FromFS, Shipped, FromConfig, FromProtocols); give one")
	case o.sources == 0:
		Shipped(configs.Default)(&o)
	}
	b, err := o.source(o.vars)
	if err != nil {
		return nil, err
	}
	if o.diag != nil {
		b.diag = *o.diag
	}
	st, err := NewStack(b.protos...)
	if err != nil {
		return nil, err
	}
	c := &Channel{st: st, cb: newCallbacks(), name: o.name}
	st.top.ch = c
	if o.logger != nil {
		st.SetLogger(o.logger)
	}
	if o.seeded {
		st.SetSeed(o.seed)
	}
	if o.receiver != nil {
		c.SetReceiver(o.receiver)
	}
	c.newAddress()
	if err := st.Init(); err != nil {
		_ = st.Close()
		return nil, err
	}
	if err := c.startDiag(b.diag); err != nil {
		_ = st.Close()
		return nil, err
	}
	return c, nil
}
