package processnode

import (
	"fmt"
	"net/netip"
)

// ipAllocator hands out the pod IPs of one node: the addresses of a /24 of
// 127.0.0.0/8, lowest free first, without the network and broadcast addresses
// and the node's own address. Lowest-free makes the allocation deterministic
// and reuses an address as soon as its pod is forgotten. It is not safe for
// concurrent use; the Provider's mutex guards it.
type ipAllocator struct {
	prefix netip.Prefix
	skip   netip.Addr
	used   map[netip.Addr]bool
}

// newIPAllocator returns an allocator for the /24 that holds nodeIP, which must
// be an IPv4 loopback address (127.0.0.0/8): every pod address is then
// reachable on this machine without configuring any interface.
func newIPAllocator(nodeIP string) (*ipAllocator, error) {
	addr, err := netip.ParseAddr(nodeIP)
	if err != nil {
		return nil, fmt.Errorf("node IP %q: %w", nodeIP, err)
	}
	if !addr.Is4() || !addr.IsLoopback() {
		return nil, fmt.Errorf("node IP %q is not an IPv4 loopback address (127.0.0.0/8): process pods listen on loopback addresses; pick one such as 127.0.1.1", nodeIP)
	}
	prefix, err := addr.Prefix(24)
	if err != nil {
		return nil, err
	}
	return &ipAllocator{prefix: prefix, skip: addr, used: map[netip.Addr]bool{}}, nil
}

// allocate returns the lowest free address, or an error when all 253 are used.
func (a *ipAllocator) allocate() (netip.Addr, error) {
	for ip := a.prefix.Addr().Next(); a.prefix.Contains(ip); ip = ip.Next() {
		if ip == a.skip || a.used[ip] || isBroadcast(ip) {
			continue
		}
		a.used[ip] = true
		return ip, nil
	}
	return netip.Addr{}, fmt.Errorf("no free pod IP left in %s", a.prefix)
}

// release returns ip to the pool; releasing a free address does nothing.
func (a *ipAllocator) release(ip netip.Addr) {
	delete(a.used, ip)
}

func isBroadcast(ip netip.Addr) bool {
	return ip.As4()[3] == 255
}
