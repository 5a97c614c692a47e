package processnode

import (
	"net/netip"
	"testing"
)

func TestIPAllocator(t *testing.T) {
	a, err := newIPAllocator("127.0.3.1")
	if err != nil {
		t.Fatal(err)
	}
	var got []netip.Addr
	for range 3 {
		ip, err := a.allocate()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ip)
	}
	want := []string{"127.0.3.2", "127.0.3.3", "127.0.3.4"}
	for i := range want {
		if got[i].String() != want[i] {
			t.Errorf("allocation %d = %s, want %s", i, got[i], want[i])
		}
	}
	a.release(got[0])
	if ip, _ := a.allocate(); ip != got[0] {
		t.Errorf("after release, allocate = %s, want the freed %s", ip, got[0])
	}
	for {
		if _, err := a.allocate(); err != nil {
			break
		}
	}
	if n := len(a.used); n != 253 {
		t.Errorf("a full /24 holds %d pod IPs, want 253 (no .0, .255 or the node's own)", n)
	}
	if a.used[netip.MustParseAddr("127.0.3.1")] || a.used[netip.MustParseAddr("127.0.3.255")] {
		t.Error("the node IP or the broadcast address was handed out")
	}
}

func TestIPAllocatorRejectsNonLoopback(t *testing.T) {
	for _, ip := range []string{"10.0.0.1", "::1", "not-an-ip"} {
		if _, err := newIPAllocator(ip); err == nil {
			t.Errorf("newIPAllocator(%q) = nil error, want one", ip)
		}
	}
}
