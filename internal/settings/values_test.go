package settings

import (
	"testing"
	"time"
)

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		err  bool
	}{
		{"90s", 90 * time.Second, false},
		{"1m30s", 90 * time.Second, false},
		{"20m", 20 * time.Minute, false},
		{"120", 120 * time.Second, false},
		{"0.5", 500 * time.Millisecond, false},
		{"0", 0, false},
		{" 15 ", 15 * time.Second, false},
		{"", 0, true},
		{"-1", 0, true},
		{"-5s", 0, true},
		{"5 minutes", 0, true},
		{"NaN", 0, true},
		{"1e300", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseDuration(tt.in)
			if (err != nil) != tt.err || got != tt.want {
				t.Errorf("ParseDuration(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.err)
			}
		})
	}
}

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		err  bool
	}{
		{"16384", 16384, false},
		{"16k", 16 << 10, false},
		{"512m", 512 << 20, false},
		{"512M", 512 << 20, false},
		{"1g", 1 << 30, false},
		{"1G", 1 << 30, false},
		{"1GB", 1 << 30, false},
		{"1gb", 1 << 30, false},
		{"1GiB", 1 << 30, false},
		{"1Gi", 1 << 30, false},
		{"1.5g", 3 << 29, false},
		{"2t", 2 << 40, false},
		{"100b", 100, false},
		{"0", 0, false},
		{"", 0, true},
		{"m", 0, true},
		{"-1m", 0, true},
		{"-1g", 0, true},
		{"1x", 0, true},
		{"lots", 0, true},
		{"99999999999t", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSize(tt.in)
			if (err != nil) != tt.err || got != tt.want {
				t.Errorf("ParseSize(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.err)
			}
		})
	}
}

func TestFormatSize(t *testing.T) {
	tests := []struct {
		in   int64
		want string
	}{
		{1 << 30, "1g"},
		{4 << 30, "4g"},
		{512 << 20, "512m"},
		{1536 << 20, "1536m"},
		{16384, "16k"},
		{2 << 40, "2t"},
		{1000, "1000"},
		{0, "0"},
	}
	for _, tt := range tests {
		got := FormatSize(tt.in)
		if got != tt.want {
			t.Errorf("FormatSize(%d) = %q; want %q", tt.in, got, tt.want)
		}
		if back, err := ParseSize(got); err != nil || back != tt.in {
			t.Errorf("ParseSize(FormatSize(%d)) = %d, %v; want the same number", tt.in, back, err)
		}
	}
}
