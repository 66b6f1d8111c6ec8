package settings

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// ParseDuration reads a duration as the configuration file writes it: a Go duration string ("90s",
// "1m30s", "20m") or a bare number of seconds ("120", "0.5"). Negative durations are errors.
func ParseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("empty duration")
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 || f > float64(math.MaxInt64)/float64(time.Second) {
			return 0, fmt.Errorf("%q is not a duration (seconds must be between 0 and %d)", s, math.MaxInt64/int64(time.Second))
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (write e.g. \"90s\", \"20m\" or a number of seconds)", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("%q is negative", s)
	}
	return d, nil
}

// ParseSize reads a size in bytes: a bare number of bytes ("16384") or a number with a binary unit
// suffix k, m, g or t, optionally followed by "b", "i" or "ib" and in any case ("512m", "1g", "1.5G",
// "64KiB", "1GB"). Every unit is a power of 1024, as in Docker and Kubernetes memory limits; "1GB" is
// therefore 1<<30 bytes. Negative sizes are errors.
func ParseSize(s string) (int64, error) {
	orig := s
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "" {
		return 0, fmt.Errorf("empty size")
	}
	for _, suffix := range []string{"ib", "b", "i"} {
		if t, ok := strings.CutSuffix(s, suffix); ok && t != "" {
			s = t
			break
		}
	}
	mult := int64(1)
	switch s[len(s)-1] {
	case 'k':
		mult = 1 << 10
	case 'm':
		mult = 1 << 20
	case 'g':
		mult = 1 << 30
	case 't':
		mult = 1 << 40
	}
	if mult > 1 {
		s = strings.TrimSpace(s[:len(s)-1])
	}
	bad := fmt.Errorf("%q is not a size (write e.g. \"512m\", \"1g\" or a number of bytes)", orig)
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 0 {
			return 0, fmt.Errorf("%q is negative", orig)
		}
		if n > math.MaxInt64/mult {
			return 0, fmt.Errorf("%q is too large", orig)
		}
		return n * mult, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, bad
	}
	if f < 0 {
		return 0, fmt.Errorf("%q is negative", orig)
	}
	v := f * float64(mult)
	if v >= math.MaxInt64 {
		return 0, fmt.Errorf("%q is too large", orig)
	}
	return int64(v), nil
}

// FormatSize writes n bytes as ParseSize reads them, in the largest binary unit that divides n
// ("1g", "512m", "16384"), so that messages show defaults as the file would write them.
func FormatSize(n int64) string {
	for _, u := range []struct {
		suffix string
		size   int64
	}{{"t", 1 << 40}, {"g", 1 << 30}, {"m", 1 << 20}, {"k", 1 << 10}} {
		if n != 0 && n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}
