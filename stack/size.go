package stack

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Size is a number of bytes in a config. In TOML it is an integer or a
// string with a unit: "64KB" (KB, MB, GB are powers of 1000, as in JGroups;
// KiB, MiB, GiB powers of 1024). Fractions are allowed ("1.5MB").
type Size int64

var sizeUnits = []struct {
	suffix string
	mult   float64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9},
	{"k", 1e3}, {"m", 1e6}, {"g", 1e9},
	{"b", 1},
}

// ParseSize parses a size such as "64KB", "4MiB" or "1500".
func ParseSize(s string) (Size, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := 1.0
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.suffix) {
			mult = u.mult
			t = strings.TrimSpace(strings.TrimSuffix(t, u.suffix))
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("invalid size %q: want a number of bytes with an optional unit (B, KB, MB, GB, KiB, MiB, GiB), like \"64KB\"", s)
	}
	v := f * mult
	if v > math.MaxInt64 || v < math.MinInt64 {
		return 0, fmt.Errorf("size %q out of range", s)
	}
	return Size(v), nil
}

// UnmarshalTOML accepts an integer (bytes) or a string with a unit.
func (s *Size) UnmarshalTOML(v any) error {
	switch x := v.(type) {
	case int64:
		*s = Size(x)
		return nil
	case string:
		n, err := ParseSize(x)
		if err != nil {
			return err
		}
		*s = n
		return nil
	}
	return fmt.Errorf("invalid size %v: want an integer or a string like \"64KB\"", v)
}

// UnmarshalText parses a size string.
func (s *Size) UnmarshalText(b []byte) error {
	n, err := ParseSize(string(b))
	if err != nil {
		return err
	}
	*s = n
	return nil
}

// String formats the size with the largest exact unit.
func (s Size) String() string {
	v := int64(s)
	for _, u := range []struct {
		name string
		mult int64
	}{{"GiB", 1 << 30}, {"GB", 1e9}, {"MiB", 1 << 20}, {"MB", 1e6}, {"KiB", 1 << 10}, {"KB", 1e3}} {
		if v != 0 && v%u.mult == 0 {
			return fmt.Sprintf("%d%s", v/u.mult, u.name)
		}
	}
	return fmt.Sprintf("%dB", v)
}
