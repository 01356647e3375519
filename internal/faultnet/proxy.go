// Package faultnet is a TCP proxy on a loopback port for network faults in tests, the chaos suite
// and the bench: it cuts or black-holes the connections passing through it, or delays them.
package faultnet

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"time"
)

// Proxy is a TCP proxy on a loopback port in front of a server, for network faults: it can cut every
// open connection (the peer sees a reset) or black-hole them (bytes are swallowed in both directions
// and nobody is told, like a peer whose host vanished without a FIN). New connections always pass.
type Proxy struct {
	ln     net.Listener
	target string
	delay  time.Duration // each way

	mu    sync.Mutex
	conns map[*proxied]bool
	wg    sync.WaitGroup
}

type proxied struct {
	client, server net.Conn
	mu             sync.Mutex
	holed          bool
	muted          bool // the server's bytes are dropped; the client's pass
}

// Start starts a proxy on a free loopback port to target (host:port); Close stops it.
func Start(target string) (*Proxy, error) { return StartDelayed("127.0.0.1:0", target, 0) }

// StartDelayed starts a proxy on listen (host:port) to target that holds every byte for oneWay in
// each direction (a round trip of twice that), like a server across a network; Close stops it.
func StartDelayed(listen, target string, oneWay time.Duration) (*Proxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("proxy listen: %w", err)
	}
	p := &Proxy{ln: ln, target: target, delay: oneWay, conns: map[*proxied]bool{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL returns rawURL (a postgres:// URL) with its host:port replaced by the proxy's.
func (p *Proxy) URL(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("proxy url: %w", err)
	}
	u.Host = p.Addr()
	return u.String(), nil
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		pc := &proxied{client: c, server: s}
		p.mu.Lock()
		p.conns[pc] = true
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(pc, c, s)
		go p.pipe(pc, s, c)
	}
}

// pipe copies from src to dst until either side closes; while the connection is black-holed the
// bytes read are dropped.
func (p *Proxy) pipe(pc *proxied, src, dst net.Conn) {
	defer p.wg.Done()
	write, flush := dst.Write, func() {}
	if p.delay > 0 {
		line := newDelayLine(dst, p.delay)
		write, flush = line.write, line.close
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			pc.mu.Lock()
			holed := pc.holed || (pc.muted && src == pc.server)
			pc.mu.Unlock()
			if !holed {
				if _, werr := write(buf[:n]); werr != nil {
					err = werr
				}
			}
		}
		if err != nil {
			if err != io.EOF {
				_ = src.Close()
			}
			flush()
			_ = dst.Close()
			p.mu.Lock()
			delete(p.conns, pc)
			p.mu.Unlock()
			return
		}
	}
}

// BlackHole silences every connection open now: from here on nothing passes in either direction, and
// neither side is told. It returns how many connections it silenced.
func (p *Proxy) BlackHole() int { return p.each(func(pc *proxied) { pc.holed = true }) }

// MuteReplies silences the server's side of every connection open now: what the client sends still
// reaches the server, which acts on it, but its answers are dropped and nobody is told — a request
// carried out whose response was lost. New connections pass both ways. It returns how many
// connections it muted.
func (p *Proxy) MuteReplies() int { return p.each(func(pc *proxied) { pc.muted = true }) }

// each runs mark on every connection open now, under its lock, and returns how many there were.
func (p *Proxy) each(mark func(*proxied)) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pc := range p.conns {
		pc.mu.Lock()
		mark(pc)
		pc.mu.Unlock()
	}
	return len(p.conns)
}

// Cut closes every connection open now, both ways.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pc := range p.conns {
		_ = pc.client.Close()
		_ = pc.server.Close()
	}
	return len(p.conns)
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

// delayLine writes what it is given to dst delay later, in order.
type delayLine struct {
	dst   net.Conn
	delay time.Duration
	queue chan delayed
	done  chan struct{}
	mu    sync.Mutex
	err   error
}

type delayed struct {
	b   []byte
	due time.Time
}

func newDelayLine(dst net.Conn, delay time.Duration) *delayLine {
	l := &delayLine{dst: dst, delay: delay, queue: make(chan delayed, 1024), done: make(chan struct{})}
	go l.run()
	return l
}

func (l *delayLine) run() {
	defer close(l.done)
	for d := range l.queue {
		time.Sleep(time.Until(d.due))
		if _, err := l.dst.Write(d.b); err != nil {
			l.mu.Lock()
			l.err = err
			l.mu.Unlock()
			for range l.queue { // drop the rest
			}
			return
		}
	}
}

// write queues a copy of b; it returns the error of an earlier write, if any.
func (l *delayLine) write(b []byte) (int, error) {
	l.mu.Lock()
	err := l.err
	l.mu.Unlock()
	if err != nil {
		return 0, err
	}
	l.queue <- delayed{b: append([]byte(nil), b...), due: time.Now().Add(l.delay)}
	return len(b), nil
}

// close writes what is queued and ends the line.
func (l *delayLine) close() {
	close(l.queue)
	<-l.done
}
