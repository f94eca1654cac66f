package stack

import (
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

// CounterStats returns the counters of the struct p points to: each field
// of type atomic.Int64 tagged `stat:"name"`, in field order, marked
// Counter; a field tagged `stat:"name,gauge"` (a peak, a highest seqno) is
// reported as a gauge. A protocol declares its counters once, with their
// names, and its Stats returns CounterStats(p) (plus the gauges it computes).
func CounterStats(p any) []Stat {
	v := reflect.ValueOf(p)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		panic(fmt.Sprintf("stack: CounterStats of %T, want a pointer to a struct", p))
	}
	fields := counterFields(v.Elem().Type())
	out := make([]Stat, len(fields))
	base := v.UnsafePointer()
	for i, f := range fields {
		out[i] = Stat{Name: f.name, Value: (*atomic.Int64)(unsafe.Add(base, f.offset)).Load(), Counter: !f.gauge}
	}
	return out
}

type counterField struct {
	name   string
	offset uintptr
	gauge  bool
}

var counterTypes sync.Map // reflect.Type -> []counterField

func counterFields(t reflect.Type) []counterField {
	if fs, ok := counterTypes.Load(t); ok {
		return fs.([]counterField)
	}
	var fs []counterField
	counter := reflect.TypeFor[atomic.Int64]()
	for f := range t.Fields() {
		tag, ok := f.Tag.Lookup("stat")
		if !ok {
			continue
		}
		name, opt, _ := strings.Cut(tag, ",")
		if opt != "" && opt != "gauge" {
			panic(fmt.Sprintf("stack: %s.%s: unknown stat tag option %q (want \"gauge\" or none)", t, f.Name, opt))
		}
		if f.Type != counter {
			panic(fmt.Sprintf("stack: %s.%s has a stat tag but is a %s, not an atomic.Int64", t, f.Name, f.Type))
		}
		fs = append(fs, counterField{name: name, offset: f.Offset, gauge: opt == "gauge"})
	}
	counterTypes.Store(t, fs)
	return fs
}
