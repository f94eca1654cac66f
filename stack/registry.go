package stack

import (
	"fmt"
	"reflect"
	"slices"
	"sync"
)

// ProtocolSpec describes a protocol type to Register: its name in configs,
// its fixed id (see ids.go), a one-line description, its config struct C
// with defaults, and the constructor that builds a layer from a config.
//
// C's exported fields are the config keys: `toml:"key"` names the key and
// `doc:"..."` describes it in one line. If *C has a Validate() error method
// it is called after decoding and before New.
//
// Provides, Requires and RequiresAbove declare the services the layer
// gives the layers above it and needs below and above it (JGroups'
// required services); the config loader refuses a stack that leaves a
// requirement unmet, naming the line and what is missing.
type ProtocolSpec[C any] struct {
	Name          string
	ID            uint16
	Doc           string
	Transport     bool
	Provides      []Service
	Requires      []Service
	RequiresAbove []Service
	Defaults      func() C
	New           func(C) (Protocol, error)
}

// Service is something a layer does for the layers around it, which a
// stack config must arrange for (a transport below everything, reliable
// multicast below membership, membership below FLUSH...).
type Service string

// The services the shipped protocols provide and require.
const (
	ServiceTransport         Service = "a transport"
	ServiceDiscovery         Service = "discovery"
	ServiceReliableMulticast Service = "reliable multicast"
	ServiceReliableUnicast   Service = "reliable unicast"
	ServiceMembership        Service = "membership"
	ServiceFailureDetection  Service = "failure detection"
)

// ProtocolType is a registered protocol type, as the config loader and
// `stackdemo protocols` see it.
type ProtocolType struct {
	Name          string
	ID            uint16
	Doc           string
	Transport     bool
	Provides      []Service
	Requires      []Service
	RequiresAbove []Service
	Keys          []KeyInfo

	newConfig func() any // pointer to a config with defaults
	build     func(any) (Protocol, error)
}

// KeyInfo documents one config key of a protocol.
type KeyInfo struct {
	Key     string
	Type    string
	Default string
	Doc     string
	field   []int
	kind    keyKind
}

// Validator is implemented by config structs that check their values.
type Validator interface {
	Validate() error
}

var (
	regMu    sync.RWMutex
	registry = map[string]*ProtocolType{}
	regIDs   = map[uint16]string{}
)

// Register adds a protocol type to the registry. It is meant for init
// functions; an empty name, a missing constructor, or a name or id that is
// already registered panics (database/sql's strict form).
func Register[C any](s ProtocolSpec[C]) {
	if s.Name == "" || s.New == nil || s.Defaults == nil {
		panic("stack: Register needs Name, Defaults and New")
	}
	if s.Transport && !slices.Contains(s.Provides, ServiceTransport) {
		s.Provides = append(slices.Clone(s.Provides), ServiceTransport)
	}
	ct := reflect.TypeFor[C]()
	if ct.Kind() != reflect.Struct {
		panic("stack: Register " + s.Name + ": config type must be a struct")
	}
	keys, err := configKeys(ct, reflect.ValueOf(s.Defaults()))
	if err != nil {
		panic("stack: Register " + s.Name + ": " + err.Error())
	}
	t := &ProtocolType{
		Name: s.Name, ID: s.ID, Doc: s.Doc, Transport: s.Transport, Keys: keys,
		Provides: s.Provides, Requires: s.Requires, RequiresAbove: s.RequiresAbove,
		newConfig: func() any { c := s.Defaults(); return &c },
	}
	t.build = func(c any) (Protocol, error) {
		cfg := *c.(*C)
		p, err := s.New(cfg)
		if err == nil && p != nil {
			p.base().built = &builtFrom{t: t, cfg: &cfg}
		}
		return p, err
	}
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := registry[s.Name]; dup {
		panic("stack: protocol " + s.Name + " registered twice")
	}
	if s.ID != 0 {
		if other, dup := regIDs[s.ID]; dup {
			panic(fmt.Sprintf("stack: protocol id %d of %s already belongs to %s", s.ID, s.Name, other))
		}
		regIDs[s.ID] = s.Name
	}
	registry[s.Name] = t
}

// LookupProtocol returns the registered type named name.
func LookupProtocol(name string) (*ProtocolType, bool) {
	regMu.RLock()
	defer regMu.RUnlock()
	t, ok := registry[name]
	return t, ok
}

// Registered returns every registered protocol type, sorted by name.
func Registered() []*ProtocolType {
	regMu.RLock()
	defer regMu.RUnlock()
	out := make([]*ProtocolType, 0, len(registry))
	for _, t := range registry {
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b *ProtocolType) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

func registeredNames() []string {
	var names []string
	for _, t := range Registered() {
		names = append(names, t.Name)
	}
	return names
}

// DefaultConfig returns a pointer to a new config of the type with its
// defaults, for building stacks in code.
func (t *ProtocolType) DefaultConfig() any { return t.newConfig() }

// Build validates cfg (a pointer returned by DefaultConfig) and builds a
// protocol from it.
func (t *ProtocolType) Build(cfg any) (Protocol, error) {
	if v, ok := cfg.(Validator); ok {
		if err := v.Validate(); err != nil {
			return nil, err
		}
	}
	return t.build(cfg)
}

// NewProtocol builds a protocol of the registered type name from its
// defaults, changed by the optional set function; for stacks built in code
// (FromProtocols).
func NewProtocol[C any](name string, set func(*C)) (Protocol, error) {
	t, ok := LookupProtocol(name)
	if !ok {
		return nil, fmt.Errorf("stack: unknown protocol %q (registered: %v)", name, registeredNames())
	}
	cfg, ok := t.newConfig().(*C)
	if !ok {
		return nil, fmt.Errorf("stack: protocol %s is not configured by %T", name, *new(C))
	}
	if set != nil {
		set(cfg)
	}
	return t.Build(cfg)
}

// Settings returns every config key of p and its value, in declaration
// order, for diagnostics; nil when p was not built through the registry
// (NewProtocol, a config file, ProtocolType.Build).
func Settings(p Protocol) []Setting {
	bf := p.base().built
	if bf == nil {
		return nil
	}
	cur := reflect.ValueOf(bf.cfg).Elem()
	out := make([]Setting, 0, len(bf.t.Keys))
	for _, k := range bf.t.Keys {
		out = append(out, Setting{k.Key, formatValue(cur.FieldByIndex(k.field))})
	}
	return out
}
