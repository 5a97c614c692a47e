package agent

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// connGate is the signal endpoint's listener and connection keeper (issue
// #26, N4). Every pod of a process node connects from loopback, and on a
// real node from the node's own pod network, so a cap per source address
// cannot tell an attacker from a worker; instead connections earn trust:
//
//   - a connection is trusted once it carried a request whose pod token was
//     accepted (Agent.authorizePod marks it), and a pod holds at most
//     perPod trusted connections: its next one makes its oldest close
//     (issue #42, H1: any pod has a valid token of its own, and with trust
//     per connection one pod could hold every slot as a trusted one);
//   - at most max connections are open; one that arrives when all are taken
//     evicts an untrusted connection (evictable: an idle one first, then one
//     that waited or has been in a request for longer than slowRequest, a
//     request sent byte by byte, then the oldest new one), and is refused
//     (closed at once) only when every open connection is trusted or in a
//     short request;
//   - an untrusted connection idle for shortIdle is closed; a trusted one
//     keeps the server's IdleTimeout.
//
// So 256 keep-alive connections to /healthz, or a flood of forged tokens,
// cannot keep a worker from hearing its signal: the worker's connection is
// trusted after its first answer, and its first request evicts an
// attacker's idle connection.
type connGate struct {
	net.Listener
	max         int
	perPod      int
	shortIdle   time.Duration
	slowRequest time.Duration
	now         func() time.Time

	mu    sync.Mutex
	conns map[*gateConn]struct{}
}

// gateConn is one accepted connection; its fields are guarded by the gate's mu.
type gateConn struct {
	net.Conn
	g       *connGate
	state   http.ConnState
	since   time.Time // when it entered state
	trusted bool
	pod     string    // namespace/name of the pod whose token trusted it
	trustAt time.Time // when
	idle    *time.Timer
	closed  sync.Once
}

func newConnGate(l net.Listener, max, perPod int, shortIdle time.Duration) *connGate {
	return &connGate{Listener: l, max: max, perPod: perPod, shortIdle: shortIdle, slowRequest: time.Second, now: time.Now,
		conns: map[*gateConn]struct{}{}}
}

// Accept returns the next connection, after making room for it.
func (g *connGate) Accept() (net.Conn, error) {
	for {
		c, err := g.Listener.Accept()
		if err != nil {
			return nil, err
		}
		gc := &gateConn{Conn: c, g: g, state: http.StateNew, since: g.now()}
		g.mu.Lock()
		var victim *gateConn
		if len(g.conns) >= g.max {
			victim = g.evictable()
			if victim == nil {
				g.mu.Unlock()
				_ = c.Close() // every connection is trusted or in a short request
				continue
			}
			delete(g.conns, victim)
		}
		g.conns[gc] = struct{}{}
		g.mu.Unlock()
		if victim != nil {
			_ = victim.Close()
		}
		return gc, nil
	}
}

// evictable returns the untrusted connection to close to make room, or nil;
// g.mu is held. First the oldest idle one (it was answered and holds a slot
// for nothing), then the oldest that has sent no request or been in one for
// slowRequest, then the oldest new one (a burst of new connections: the
// oldest has had the longest to send its request).
func (g *connGate) evictable() *gateConn {
	now := g.now()
	var best *gateConn
	rank := func(c *gateConn) int {
		switch {
		case c.state == http.StateIdle:
			return 0
		case now.Sub(c.since) >= g.slowRequest:
			return 1
		case c.state == http.StateNew:
			return 2
		}
		return 3 // in a short request: kept
	}
	for c := range g.conns {
		if c.trusted || rank(c) == 3 {
			continue
		}
		if best == nil || rank(c) < rank(best) || rank(c) == rank(best) && c.since.Before(best.since) {
			best = c
		}
	}
	return best
}

// connState is the http.Server's ConnState hook.
func (g *connGate) connState(c net.Conn, s http.ConnState) {
	gc, ok := c.(*gateConn)
	if !ok {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	gc.state, gc.since = s, g.now()
	if gc.idle != nil {
		gc.idle.Stop()
		gc.idle = nil
	}
	switch s {
	case http.StateIdle:
		if !gc.trusted {
			gc.idle = time.AfterFunc(g.shortIdle, func() {
				g.mu.Lock()
				still := gc.state == http.StateIdle && !gc.trusted
				g.mu.Unlock()
				if still {
					_ = gc.Close()
				}
			})
		}
	case http.StateClosed, http.StateHijacked:
		delete(g.conns, gc)
	}
}

// trust marks the connection that carried r as trusted by pod
// (namespace/name); the pod's oldest trusted connection closes when it
// would hold more than perPod.
func (g *connGate) trust(r *http.Request, pod string) {
	gc, ok := r.Context().Value(connKey{}).(*gateConn)
	if !ok {
		return
	}
	var victim *gateConn
	g.mu.Lock()
	if !gc.trusted {
		n := 0
		for c := range g.conns {
			if c.trusted && c.pod == pod {
				n++
				if victim == nil || c.trustAt.Before(victim.trustAt) {
					victim = c
				}
			}
		}
		if n < g.perPod {
			victim = nil
		}
		gc.trusted, gc.pod, gc.trustAt = true, pod, g.now()
	}
	g.mu.Unlock()
	if victim != nil {
		_ = victim.Close()
	}
}

// Close closes the connection once and forgets it.
func (c *gateConn) Close() error {
	err := error(nil)
	c.closed.Do(func() {
		c.g.mu.Lock()
		delete(c.g.conns, c)
		c.g.mu.Unlock()
		err = c.Conn.Close()
	})
	return err
}

type connKey struct{}

// connContext is the http.Server's ConnContext hook: a request knows its
// connection (trust).
func connContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}
