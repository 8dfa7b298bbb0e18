package chaos

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// tcpProxyDialTimeout bounds the connection to the proxy's target.
const tcpProxyDialTimeout = 2 * time.Second

// tcpProxy forwards TCP connections accepted on a loopback port to a target
// address. It can stop forwarding without closing anything (Pause, Resume),
// as a stalled network link would, and move to another target (Switch), as
// a virtual IP or a DNS name does when a database fails over. The failover
// drill puts one in front of the standby's replication stream and one in
// front of every Tally process's database connections.
type tcpProxy struct {
	name string
	ln   net.Listener

	mu     sync.Mutex
	cond   *sync.Cond // broadcast on Resume, Close and whenever a pair closes
	target string
	gen    int // bumped by Switch; a pair dialled under an older one is closed
	paused bool
	closed bool
	pairs  map[*proxyPair]struct{}

	wg sync.WaitGroup // the accept loop and every pair's copy loops
}

// proxyPair is one client connection and its connection to the target.
type proxyPair struct {
	client, server net.Conn
	closed         bool // guarded by tcpProxy.mu
}

// newTCPProxy listens on a free loopback port and forwards every accepted
// connection to target (host:port). It returns an error when it cannot
// listen. Close stops it.
func newTCPProxy(name, target string) (*tcpProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("error listening for the %s proxy: %w", name, err)
	}
	p := &tcpProxy{name: name, ln: ln, target: target, pairs: map[*proxyPair]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the proxy's listen address, 127.0.0.1:port.
func (p *tcpProxy) Addr() string { return p.ln.Addr().String() }

// Port is the proxy's listen port.
func (p *tcpProxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// Target is the address new connections are forwarded to.
func (p *tcpProxy) Target() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.target
}

// Pause stops forwarding bytes in both directions. Connections stay open
// and new ones are still accepted and dialled; what either side sends waits
// (in the proxy's buffers and the kernel's) until Resume, or is dropped by
// Switch or Close.
func (p *tcpProxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = true
}

// Resume forwards bytes again after Pause.
func (p *tcpProxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = false
	p.cond.Broadcast()
}

// Switch sends new connections to target and closes every existing one,
// whatever it was connected to; clients see their connection drop and
// reconnect to the new target.
func (p *tcpProxy) Switch(target string) {
	p.mu.Lock()
	p.target = target
	p.gen++
	pairs := make([]*proxyPair, 0, len(p.pairs))
	for pair := range p.pairs {
		pairs = append(pairs, pair)
	}
	p.mu.Unlock()
	for _, pair := range pairs {
		p.closePair(pair)
	}
}

// Close stops accepting, closes every connection and waits for the
// forwarding goroutines to end. It is safe to call more than once.
func (p *tcpProxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	pairs := make([]*proxyPair, 0, len(p.pairs))
	for pair := range p.pairs {
		pairs = append(pairs, pair)
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	err := p.ln.Close()
	for _, pair := range pairs {
		p.closePair(pair)
	}
	p.wg.Wait()
	return err
}

func (p *tcpProxy) acceptLoop() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // e.g. out of file descriptors: try again
			continue
		}
		p.wg.Add(1)
		go p.serve(client)
	}
}

// serve dials the current target for client and forwards between the two
// until either side closes, the proxy switches or closes.
func (p *tcpProxy) serve(client net.Conn) {
	defer p.wg.Done()
	p.mu.Lock()
	target, gen := p.target, p.gen
	p.mu.Unlock()
	server, err := net.DialTimeout("tcp", target, tcpProxyDialTimeout)
	if err != nil {
		_ = client.Close() // the client sees the refusal as a closed connection
		return
	}
	pair := &proxyPair{client: client, server: server}
	p.mu.Lock()
	if p.closed || p.gen != gen {
		p.mu.Unlock()
		_ = client.Close()
		_ = server.Close()
		return
	}
	p.pairs[pair] = struct{}{}
	p.mu.Unlock()

	var copies sync.WaitGroup
	copies.Add(2)
	go func() { defer copies.Done(); p.copy(pair, server, client) }()
	go func() { defer copies.Done(); p.copy(pair, client, server) }()
	copies.Wait()
	p.mu.Lock()
	delete(p.pairs, pair)
	p.mu.Unlock()
}

// copy forwards src to dst, holding what it read while the proxy is
// paused, and closes the pair when either side ends.
func (p *tcpProxy) copy(pair *proxyPair, dst, src net.Conn) {
	defer p.closePair(pair)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.waitForwarding(pair) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// waitForwarding blocks while the proxy is paused; it returns false once
// the pair or the proxy is closed.
func (p *tcpProxy) waitForwarding(pair *proxyPair) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.paused && !p.closed && !pair.closed {
		p.cond.Wait()
	}
	return !p.closed && !pair.closed
}

// closePair closes both connections of pair once and wakes its copy loops.
func (p *tcpProxy) closePair(pair *proxyPair) {
	p.mu.Lock()
	if pair.closed {
		p.mu.Unlock()
		return
	}
	pair.closed = true
	p.cond.Broadcast()
	p.mu.Unlock()
	_ = pair.client.Close()
	_ = pair.server.Close()
}
