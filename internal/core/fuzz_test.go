package core

import (
	"strings"
	"testing"
	"unicode"
)

// FuzzParseHost reads any membership entry. Properties: no panic; an
// accepted entry has a host that is one whitespace-free field without ':'
// and positive slots, FormatHost writes it back to an entry that parses the
// same, and hostName (what the timeline and worker states use) agrees.
//
//	go test -run '^$' -fuzz '^FuzzParseHost$' -fuzztime 60s ./internal/core
func FuzzParseHost(f *testing.F) {
	for _, s := range []string{"elastic-training-worker-0:1", "h-worker-3:2", "digits-worker-12:8", "w:", ":1", "w:0", "w:+1", "a:b:2", "w 1:2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, entry string) {
		host, slots, ok := ParseHost(entry)
		if !ok {
			if host != "" || slots != 0 {
				t.Fatalf("ParseHost(%q) refused it but returned %q, %d", entry, host, slots)
			}
			return
		}
		if slots < 1 || host == "" || strings.ContainsRune(host, ':') || strings.ContainsFunc(host, unicode.IsSpace) || len(strings.Fields(host)) != 1 {
			t.Fatalf("ParseHost(%q) = %q, %d: want a single-field host without ':' and positive slots", entry, host, slots)
		}
		again := FormatHost(host, slots)
		if h, s, ok := ParseHost(again); !ok || h != host || s != slots {
			t.Fatalf("FormatHost(%q, %d) = %q parses to %q, %d, %t", host, slots, again, h, s, ok)
		}
		if got := HostName(entry); got != host {
			t.Fatalf("HostName(%q) = %q, ParseHost says %q", entry, got, host)
		}
	})
}
