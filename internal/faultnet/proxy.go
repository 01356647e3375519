// Package faultnet is a TCP proxy on a loopback port for network faults in tests and the chaos
// suite: it cuts or black-holes the connections passing through it.
package faultnet

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
)

// Proxy is a TCP proxy on a loopback port in front of a server, for network faults: it can cut every
// open connection (the peer sees a reset) or black-hole them (bytes are swallowed in both directions
// and nobody is told, like a peer whose host vanished without a FIN). New connections always pass.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	conns map[*proxied]bool
	wg    sync.WaitGroup
}

type proxied struct {
	client, server net.Conn
	mu             sync.Mutex
	holed          bool
}

// Start starts a proxy on a free loopback port to target (host:port); Close stops it.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy listen: %w", err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[*proxied]bool{}}
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
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			pc.mu.Lock()
			holed := pc.holed
			pc.mu.Unlock()
			if !holed {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					err = werr
				}
			}
		}
		if err != nil {
			if err != io.EOF {
				_ = src.Close()
			}
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
func (p *Proxy) BlackHole() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pc := range p.conns {
		pc.mu.Lock()
		pc.holed = true
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
