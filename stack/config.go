package stack

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// ConfigError is a configuration problem, placed as precisely as possible:
// file, line, protocol and key. Its text reads "file:line: protocol: key:
// reason".
type ConfigError struct {
	File     string
	Line     int // 0 if unknown
	Protocol string
	Key      string
	Reason   string
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
		}
		b.WriteString(": ")
	}
	if e.Protocol != "" {
		b.WriteString(e.Protocol)
		b.WriteString(": ")
	}
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Reason)
	return b.String()
}

// KeyError is returned by a config's Validate to blame one key; the loader
// turns it into a ConfigError with the key's line.
type KeyError struct {
	Key    string
	Reason string
}

func (e *KeyError) Error() string { return e.Key + ": " + e.Reason }

// BadKey returns a KeyError for key with a formatted reason.
func BadKey(key, format string, args ...any) error {
	return &KeyError{Key: key, Reason: fmt.Sprintf(format, args...)}
}

// StackConfig is a parsed stack configuration: its protocols, bottom
// first, and the channel settings given by top-level keys (diag_addr).
type StackConfig struct {
	File      string
	Protocols []*ProtocolConfig
	// DiagAddr is where a channel built from this config serves its
	// diagnostics (top-level key diag_addr; empty, the default: nowhere).
	DiagAddr string
}

// DiagAddrKey is the top-level config key of the diagnostics address.
const DiagAddrKey = "diag_addr"

// ProtocolConfig is one decoded [[protocol]] table.
type ProtocolConfig struct {
	Type   *ProtocolType
	Line   int            // line of the [[protocol]] header
	Config any            // pointer to the decoded config struct
	Keys   map[string]int // keys set in the file, with their lines
}

// LoadConfig reads and parses a stack config file.
func LoadConfig(path string) (*StackConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &ConfigError{File: path, Reason: err.Error()}
	}
	return ParseConfig(path, data)
}

var (
	protocolHeader = regexp.MustCompile(`^\s*\[\[\s*protocol\s*\]\]`)
	anyHeader      = regexp.MustCompile(`^\s*\[`)
	keyLine        = regexp.MustCompile(`^\s*("?)([A-Za-z0-9_\-]+)("?)\s*=`)
	envRef         = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_.]*)(:([^}]*))?\}`)
	tomlLine       = regexp.MustCompile(`line (\d+)`)
	tomlLastKey    = regexp.MustCompile(`last key "([^"]*)"`)
)

// ParseConfig parses a stack config: a list of [[protocol]] tables, bottom
// first, each with type = "NAME" and that protocol's keys. file names the
// source in errors.
func ParseConfig(file string, data []byte) (*StackConfig, error) {
	return ParseConfigVars(file, data, nil)
}

// ParseConfigVars is ParseConfig with ${NAME} taken from vars first and
// the environment second, so programs and parallel tests can set a
// config's variables without touching the process environment.
func ParseConfigVars(file string, data []byte, vars map[string]string) (*StackConfig, error) {
	lookup := func(name string) (string, bool) {
		if v, ok := vars[name]; ok {
			return v, true
		}
		return os.LookupEnv(name)
	}
	text, err := substituteEnv(file, string(data), lookup)
	if err != nil {
		return nil, err
	}
	var doc struct {
		DiagAddr any              `toml:"diag_addr"`
		Protocol []toml.Primitive `toml:"protocol"`
	}
	md, err := toml.Decode(text, &doc)
	if err != nil {
		return nil, tomlError(file, err)
	}
	sections := scanSections(text)
	for _, k := range md.Undecoded() {
		if len(k) == 1 || k[0] != "protocol" {
			return nil, &ConfigError{File: file, Line: topLevelLine(text, k[0]), Key: k.String(),
				Reason: "unknown top-level key; a stack config holds only [[protocol]] tables"}
		}
	}
	if len(doc.Protocol) == 0 {
		return nil, &ConfigError{File: file, Reason: "no [[protocol]] tables; a stack needs at least a transport"}
	}
	if len(sections) != len(doc.Protocol) {
		// [[protocol]] written in an unusual form; lines become approximate.
		sections = make([]section, len(doc.Protocol))
	}
	sc := &StackConfig{File: file}
	if doc.DiagAddr != nil {
		cerr := func(format string, args ...any) error {
			return &ConfigError{File: file, Line: topLevelLine(text, DiagAddrKey), Key: DiagAddrKey, Reason: fmt.Sprintf(format, args...)}
		}
		addr, ok := doc.DiagAddr.(string)
		if !ok {
			return nil, cerr("want a string such as \"127.0.0.1:7900\" (\"\": off), got %v", describe(doc.DiagAddr))
		}
		if addr != "" {
			if err := CheckDiagAddr(addr); err != nil {
				return nil, cerr("%v", err)
			}
		}
		sc.DiagAddr = addr
	}
	for i, prim := range doc.Protocol {
		pc, err := decodeProtocol(file, md, prim, sections[i], i)
		if err != nil {
			return nil, err
		}
		sc.Protocols = append(sc.Protocols, pc)
	}
	if err := sc.checkTransport(); err != nil {
		return nil, err
	}
	if err := sc.checkServices(); err != nil {
		return nil, err
	}
	if err := sc.checkSizes(); err != nil {
		return nil, err
	}
	if err := sc.checkFragmentOrder(); err != nil {
		return nil, err
	}
	return sc, nil
}

// checkServices refuses a stack in which a layer's required service is
// not provided where it must be: below it (Requires) or above it
// (RequiresAbove).
func (sc *StackConfig) checkServices() error {
	for i, p := range sc.Protocols {
		missing := func(s Service, where string, among []*ProtocolConfig) error {
			for _, q := range among {
				if slices.Contains(q.Type.Provides, s) {
					return nil
				}
			}
			return &ConfigError{File: sc.File, Line: p.Line, Protocol: p.Type.Name,
				Reason: fmt.Sprintf("needs %s %s it, and no layer %s it provides it (%s does)", s, where, where, strings.Join(providers(s), ", "))}
		}
		for _, s := range p.Type.Requires {
			if err := missing(s, "below", sc.Protocols[:i]); err != nil {
				return err
			}
		}
		for _, s := range p.Type.RequiresAbove {
			if err := missing(s, "above", sc.Protocols[i+1:]); err != nil {
				return err
			}
		}
	}
	return nil
}

// providers lists the registered protocols that provide s.
func providers(s Service) []string {
	var out []string
	for _, t := range Registered() {
		if slices.Contains(t.Provides, s) {
			out = append(out, t.Name)
		}
	}
	if len(out) == 0 {
		return []string{"none registered"}
	}
	return out
}

// DatagramLimiter is implemented by the config of a transport that sends
// datagrams (or frames) of a bounded size; 0 means no bound.
type DatagramLimiter interface {
	MaxDatagram() Size
}

// FragmentSizer is implemented by the config of a layer that cuts larger
// messages into fragments of at most FragmentSize bytes (FRAG).
type FragmentSizer interface {
	FragmentSize() Size
}

// FragmentedBelow is implemented by the config of a layer that puts its
// large messages in payloads for a fragmenting layer below it to split
// (FLUSH: participant lists and digests grow with the group); the loader
// refuses a stack whose fragmenting layer (FragmentSizer) is above it.
type FragmentedBelow interface {
	FragmentedBelow()
}

// ControlSizer is implemented by the config of a layer that sends control
// messages of its own below FRAG (GMS, STABLE, discovery, MERGE3), which
// FRAG never cuts. MinControlLimit is the smallest Stack.ControlLimit with
// which they all fit one datagram: the largest message the layer sends
// whole, or the smallest part it cuts its larger messages into.
type ControlSizer interface {
	MinControlLimit() Size
}

// Headroom is what a message needs in a datagram beyond what the layer
// that made it put in (its header and payload): the bundle's preamble,
// the message's own preamble and every other layer's headers.
const Headroom = 1024

// FragmentHeadroom is what a fragment needs beyond its payload in a
// datagram: Headroom.
const FragmentHeadroom = Headroom

// checkSizes refuses fragments that cannot fit the transport's largest
// datagram, and control messages (whole, or their parts) that cannot.
func (sc *StackConfig) checkSizes() error {
	tr := sc.Protocols[0]
	lim, ok := tr.Config.(DatagramLimiter)
	if !ok || lim.MaxDatagram() <= 0 {
		return nil
	}
	for _, p := range sc.Protocols[1:] {
		fs, ok := p.Config.(FragmentSizer)
		if !ok || fs.FragmentSize()+FragmentHeadroom <= lim.MaxDatagram() {
			continue
		}
		line := p.Line
		for k, l := range p.Keys {
			if strings.Contains(k, "frag") && l > 0 {
				line = l
			}
		}
		return &ConfigError{File: sc.File, Line: line, Protocol: p.Type.Name, Key: "frag_size",
			Reason: fmt.Sprintf("%s does not fit %s's largest datagram (%s) with %d bytes for headers; make it at most %s",
				fs.FragmentSize(), tr.Type.Name, lim.MaxDatagram(), FragmentHeadroom, lim.MaxDatagram()-FragmentHeadroom)}
	}
	for _, p := range sc.Protocols[1:] {
		cs, ok := p.Config.(ControlSizer)
		if !ok || lim.MaxDatagram()-Headroom >= cs.MinControlLimit() {
			continue
		}
		line := tr.Line
		if l, ok := tr.Keys["max_bundle_size"]; ok && l > 0 {
			line = l
		}
		return &ConfigError{File: sc.File, Line: line, Protocol: tr.Type.Name, Key: "max_bundle_size",
			Reason: fmt.Sprintf("%s cannot carry %s's control messages: they need %s (whole, or each of their parts) and %d bytes for headers; make it at least %s",
				lim.MaxDatagram(), p.Type.Name, cs.MinControlLimit(), Headroom, cs.MinControlLimit()+Headroom)}
	}
	return nil
}

// checkFragmentOrder refuses a stack with a fragmenting layer above a
// layer that needs one below it (FragmentedBelow).
func (sc *StackConfig) checkFragmentOrder() error {
	for i, p := range sc.Protocols {
		if _, ok := p.Config.(FragmentedBelow); !ok {
			continue
		}
		for _, q := range sc.Protocols[i+1:] {
			if _, ok := q.Config.(FragmentSizer); ok {
				return &ConfigError{File: sc.File, Line: p.Line, Protocol: p.Type.Name,
					Reason: fmt.Sprintf("must be above %s: %s splits its large messages, which grow with the group", q.Type.Name, q.Type.Name)}
			}
		}
	}
	return nil
}

func (sc *StackConfig) checkTransport() error {
	var ts []*ProtocolConfig
	for _, p := range sc.Protocols {
		if p.Type.Transport {
			ts = append(ts, p)
		}
	}
	switch {
	case len(ts) == 0:
		p := sc.Protocols[0]
		return &ConfigError{File: sc.File, Line: p.Line, Protocol: p.Type.Name,
			Reason: "no transport in the stack: the first [[protocol]] must be a transport (" + strings.Join(transportNames(), ", ") + ")"}
	case len(ts) > 1:
		return &ConfigError{File: sc.File, Line: ts[1].Line, Protocol: ts[1].Type.Name,
			Reason: fmt.Sprintf("second transport (the first is %s on line %d); a stack has exactly one", ts[0].Type.Name, ts[0].Line)}
	case ts[0] != sc.Protocols[0]:
		return &ConfigError{File: sc.File, Line: ts[0].Line, Protocol: ts[0].Type.Name,
			Reason: "the transport must be the first [[protocol]] (configs list protocols bottom first)"}
	}
	return nil
}

func transportNames() []string {
	var out []string
	for _, t := range Registered() {
		if t.Transport {
			out = append(out, t.Name)
		}
	}
	return out
}

func decodeProtocol(file string, md toml.MetaData, prim toml.Primitive, sec section, idx int) (*ProtocolConfig, error) {
	var raw map[string]any
	if err := md.PrimitiveDecode(prim, &raw); err != nil {
		return nil, tomlError(file, err)
	}
	cerr := func(proto, key, format string, args ...any) error {
		line := sec.line
		if key != "" {
			if l, ok := sec.keys[key]; ok {
				line = l
			}
		}
		return &ConfigError{File: file, Line: line, Protocol: proto, Key: key, Reason: fmt.Sprintf(format, args...)}
	}
	label := fmt.Sprintf("protocol #%d", idx+1)
	tv, ok := raw["type"]
	if !ok {
		return nil, cerr(label, "type", "missing; every [[protocol]] needs type = \"NAME\" (registered: %s)", strings.Join(registeredNames(), ", "))
	}
	name, ok := tv.(string)
	if !ok {
		return nil, cerr(label, "type", "must be a string such as \"UDP\", got %v", tv)
	}
	pt, ok := LookupProtocol(name)
	if !ok {
		hint := ""
		if near := nearest(name, registeredNames()); near != "" {
			hint = fmt.Sprintf("; did you mean %q?", near)
		}
		if _, ok := LookupProtocol("NAKACK"); !ok {
			// The shipped protocols register themselves when imported.
			hint += `; a program registers the shipped protocols with import _ "github.com/strata-go/strata/protocols/all"`
		}
		return nil, cerr(label, "type", "unknown protocol %q%s (registered: %s)", name, hint, strings.Join(registeredNames(), ", "))
	}
	valid := make([]string, 0, len(pt.Keys))
	byKey := map[string]KeyInfo{}
	for _, k := range pt.Keys {
		valid = append(valid, k.Key)
		byKey[k.Key] = k
	}
	keys := slices.Sorted(mapKeys(raw))
	for _, k := range keys {
		if k == "type" {
			continue
		}
		ki, ok := byKey[k]
		if !ok {
			reason := "unknown key"
			if k == DiagAddrKey {
				reason += "; diag_addr is a top-level key: write it above the first [[protocol]]"
			} else if near := nearest(k, valid); near != "" {
				reason += fmt.Sprintf("; did you mean %q?", near)
			}
			if len(valid) == 0 {
				reason += fmt.Sprintf("; %s has no keys", name)
			} else {
				reason += fmt.Sprintf(" (valid keys: %s)", strings.Join(valid, ", "))
			}
			return nil, cerr(name, k, "%s", reason)
		}
		if err := ki.kind.check(raw[k]); err != nil {
			return nil, cerr(name, k, "%v", err)
		}
	}
	cfg := pt.newConfig()
	if err := md.PrimitiveDecode(prim, cfg); err != nil {
		key := ""
		if m := tomlLastKey.FindStringSubmatch(err.Error()); m != nil {
			key = strings.TrimPrefix(m[1], "protocol.")
		}
		return nil, cerr(name, key, "%s", cleanTomlError(err))
	}
	if v, ok := cfg.(Validator); ok {
		if err := v.Validate(); err != nil {
			var ke *KeyError
			if errors.As(err, &ke) {
				return nil, cerr(name, ke.Key, "%s", ke.Reason)
			}
			return nil, cerr(name, "", "%v", err)
		}
	}
	pc := &ProtocolConfig{Type: pt, Line: sec.line, Config: cfg, Keys: map[string]int{}}
	for _, k := range keys {
		pc.Keys[k] = sec.keys[k]
	}
	return pc, nil
}

func mapKeys(m map[string]any) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// Build constructs the protocols of the config, bottom first.
func (sc *StackConfig) Build() ([]Protocol, error) {
	out := make([]Protocol, 0, len(sc.Protocols))
	for _, pc := range sc.Protocols {
		p, err := pc.Type.build(pc.Config)
		if err != nil {
			return nil, &ConfigError{File: sc.File, Line: pc.Line, Protocol: pc.Type.Name, Reason: err.Error()}
		}
		out = append(out, p)
	}
	return out, nil
}

// Setting is one key of a protocol config and its value, for display.
type Setting struct {
	Key, Value string
}

// Changed returns the keys whose values differ from the protocol's
// defaults, in declaration order.
func (pc *ProtocolConfig) Changed() []Setting {
	def := reflect.ValueOf(pc.Type.newConfig()).Elem()
	cur := reflect.ValueOf(pc.Config).Elem()
	var out []Setting
	for _, k := range pc.Type.Keys {
		d, c := def.FieldByIndex(k.field), cur.FieldByIndex(k.field)
		if !reflect.DeepEqual(d.Interface(), c.Interface()) {
			out = append(out, Setting{k.Key, formatValue(c)})
		}
	}
	return out
}

type section struct {
	line int            // line of the [[protocol]] header, 1-based
	keys map[string]int // key -> line
}

// scanSections finds each [[protocol]] header and the lines of the keys
// directly under it. BurntSushi/toml reports no key positions, so the loader
// finds them in the text.
func scanSections(text string) []section {
	var out []section
	var cur *section
	for i, l := range strings.Split(text, "\n") {
		switch {
		case protocolHeader.MatchString(l):
			out = append(out, section{line: i + 1, keys: map[string]int{}})
			cur = &out[len(out)-1]
		case anyHeader.MatchString(l):
			cur = nil
		case cur != nil:
			if m := keyLine.FindStringSubmatch(l); m != nil {
				if _, seen := cur.keys[m[2]]; !seen {
					cur.keys[m[2]] = i + 1
				}
			}
		}
	}
	return out
}

func topLevelLine(text, key string) int {
	for i, l := range strings.Split(text, "\n") {
		if m := keyLine.FindStringSubmatch(l); m != nil && m[2] == key {
			return i + 1
		}
		if strings.Contains(l, "["+key) {
			return i + 1
		}
	}
	return 0
}

// substituteEnv replaces ${NAME:default} and ${NAME} by environment values,
// line by line (so lines stay where they were). Comments (whole lines, and
// from a # outside a string to the end of a line) are left alone. A
// reference to an unset variable without default, and a ${ that does not
// start a well-formed reference, are errors.
func substituteEnv(file, text string, lookup func(string) (string, bool)) (string, error) {
	if !strings.Contains(text, "${") {
		return text, nil
	}
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		code, comment := l, ""
		if k := commentStart(l); k >= 0 {
			code, comment = l[:k], l[k:]
		}
		if !strings.Contains(code, "${") {
			continue
		}
		if j := strings.Index(envRef.ReplaceAllString(code, ""), "${"); j >= 0 {
			return "", &ConfigError{File: file, Line: i + 1, Reason: fmt.Sprintf("malformed variable reference in %q: write ${NAME} or ${NAME:default}", strings.TrimSpace(code))}
		}
		var err error
		code = envRef.ReplaceAllStringFunc(code, func(ref string) string {
			m := envRef.FindStringSubmatch(ref)
			if v, ok := lookup(m[1]); ok {
				if strings.ContainsAny(v, "\n\r\"") && err == nil {
					err = &ConfigError{File: file, Line: i + 1, Reason: fmt.Sprintf("environment variable %s holds a newline or quote", m[1])}
				}
				return v
			}
			if m[2] != "" {
				return m[3]
			}
			if err == nil {
				err = &ConfigError{File: file, Line: i + 1, Reason: fmt.Sprintf("environment variable %s is not set and ${%s} has no default (write ${%s:default})", m[1], m[1], m[1])}
			}
			return ref
		})
		if err != nil {
			return "", err
		}
		lines[i] = code + comment
	}
	return strings.Join(lines, "\n"), nil
}

// commentStart returns where a TOML line's comment begins (a # outside a
// string), or -1.
func commentStart(line string) int {
	var quote byte
	for i := 0; i < len(line); i++ {
		switch c := line[i]; {
		case quote != 0:
			if c == '\\' && quote == '"' {
				i++
			} else if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
		case c == '#':
			return i
		}
	}
	return -1
}

func tomlError(file string, err error) error {
	var pe toml.ParseError
	if errors.As(err, &pe) {
		key := strings.TrimPrefix(pe.LastKey, "protocol.")
		return &ConfigError{File: file, Line: pe.Position.Line, Key: key, Reason: pe.Message}
	}
	ce := &ConfigError{File: file, Reason: cleanTomlError(err)}
	if m := tomlLine.FindStringSubmatch(err.Error()); m != nil {
		ce.Line, _ = strconv.Atoi(m[1])
	}
	return ce
}

var tomlPrefix = regexp.MustCompile(`^toml: (line \d+ )?(\(last key "[^"]*"\))?:?\s*`)

func cleanTomlError(err error) string {
	var pe toml.ParseError
	if errors.As(err, &pe) {
		return pe.Message
	}
	return tomlPrefix.ReplaceAllString(err.Error(), "")
}

// nearest returns the candidate closest to s by edit distance, if it is
// close enough to be a likely typo.
func nearest(s string, candidates []string) string {
	best, bestD := "", 1<<30
	ls := strings.ToLower(s)
	for _, c := range candidates {
		d := editDistance(ls, strings.ToLower(c))
		if d < bestD {
			best, bestD = c, d
		}
	}
	if bestD <= max(2, len(s)/3) {
		return best
	}
	return ""
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// keyKind is what a config key accepts, for early, key-precise type errors.
type keyKind int

const (
	kindOther keyKind = iota
	kindBool
	kindInt
	kindUint
	kindFloat
	kindString
	kindDuration
	kindSize
	kindStrings
)

var (
	durationType = reflect.TypeFor[time.Duration]()
	sizeType     = reflect.TypeFor[Size]()
)

func kindOf(t reflect.Type) (keyKind, string) {
	switch {
	case t == durationType:
		return kindDuration, "duration"
	case t == sizeType:
		return kindSize, "size"
	}
	switch t.Kind() {
	case reflect.Bool:
		return kindBool, "bool"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return kindInt, "integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return kindUint, "unsigned integer"
	case reflect.Float32, reflect.Float64:
		return kindFloat, "number"
	case reflect.String:
		return kindString, "string"
	case reflect.Slice:
		if t.Elem().Kind() == reflect.String {
			return kindStrings, "list of strings"
		}
	}
	return kindOther, t.String()
}

func (k keyKind) check(v any) error {
	switch k {
	case kindDuration:
		s, ok := v.(string)
		if !ok {
			return fmt.Errorf("want a duration string with a unit, like \"500ms\" or \"2s\", got %v", v)
		}
		if _, err := time.ParseDuration(s); err != nil {
			return fmt.Errorf("invalid duration %q: want a number with a unit, like \"500ms\" or \"2s\"", s)
		}
	case kindSize:
		switch x := v.(type) {
		case int64:
		case string:
			if _, err := ParseSize(x); err != nil {
				return err
			}
		default:
			return fmt.Errorf("want a size, like 65000 or \"64KB\", got %v", v)
		}
	case kindBool:
		if _, ok := v.(bool); !ok {
			return fmt.Errorf("want true or false, got %v", describe(v))
		}
	case kindInt, kindUint:
		if _, ok := v.(int64); !ok {
			return fmt.Errorf("want an integer, got %v", describe(v))
		}
	case kindFloat:
		switch v.(type) {
		case int64, float64:
		default:
			return fmt.Errorf("want a number, got %v", describe(v))
		}
	case kindString:
		if _, ok := v.(string); !ok {
			return fmt.Errorf("want a string, got %v", describe(v))
		}
	}
	return nil
}

func describe(v any) string {
	switch x := v.(type) {
	case string:
		return fmt.Sprintf("string %q", x)
	case int64:
		return fmt.Sprintf("integer %d", x)
	case float64:
		return fmt.Sprintf("number %v", x)
	case bool:
		return fmt.Sprintf("bool %v", x)
	}
	return fmt.Sprintf("%T %v", v, v)
}

func configKeys(t reflect.Type, def reflect.Value) ([]KeyInfo, error) {
	var out []KeyInfo
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("toml")
		name, _, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if name == "" {
			return nil, fmt.Errorf("field %s has no toml tag", f.Name)
		}
		if name == "type" {
			return nil, fmt.Errorf("field %s: key \"type\" is reserved", f.Name)
		}
		kind, tname := kindOf(f.Type)
		out = append(out, KeyInfo{
			Key: name, Type: tname, Doc: f.Tag.Get("doc"),
			Default: formatValue(def.Field(i)), field: f.Index, kind: kind,
		})
	}
	return out, nil
}

func formatValue(v reflect.Value) string {
	switch x := v.Interface().(type) {
	case time.Duration:
		return strconv.Quote(x.String())
	case Size:
		return strconv.Quote(x.String())
	case string:
		return strconv.Quote(x)
	case []string:
		q := make([]string, len(x))
		for i, s := range x {
			q[i] = strconv.Quote(s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	return fmt.Sprint(v.Interface())
}
