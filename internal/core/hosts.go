package core

import (
	"strconv"
	"strings"
	"unicode"
)

// ParseHost splits one membership entry, `host:slots` as discover_hosts.sh
// prints it for Horovod, into the host and its slots. ok is false unless the
// host is non-empty with no whitespace, control character or ':' (MPI's
// hostfile and Horovod's discovery output are split on whitespace and the
// last ':') and slots is a positive decimal number without a sign.
func ParseHost(entry string) (host string, slots int32, ok bool) {
	i := strings.LastIndexByte(entry, ':')
	if i <= 0 {
		return "", 0, false
	}
	host, digits := entry[:i], entry[i+1:]
	if strings.ContainsFunc(host, func(r rune) bool { return r == ':' || unicode.IsSpace(r) || unicode.IsControl(r) }) {
		return "", 0, false
	}
	if digits == "" || strings.Trim(digits, "0123456789") != "" {
		return "", 0, false
	}
	n, err := strconv.ParseInt(digits, 10, 32)
	if err != nil || n < 1 {
		return "", 0, false
	}
	return host, int32(n), true
}

// HostName is the host of a membership entry (the entry itself when it has
// no slots).
func HostName(entry string) string {
	if i := strings.LastIndexByte(entry, ':'); i > 0 {
		return entry[:i]
	}
	return entry
}

// FormatHost is the membership entry of host with slots: ParseHost's inverse.
func FormatHost(host string, slots int32) string {
	return host + ":" + strconv.Itoa(int(slots))
}
