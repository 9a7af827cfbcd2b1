package testcluster

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"

	"github.com/tokenserver/tokenserver/internal/server"
)

// Network routes every node-to-node Raft connection through its own TCP
// proxy (toxiproxy, one per ordered pair of nodes), so a test can cut a
// node off from the others and heal it again.
type Network struct {
	mu      sync.Mutex
	api     *toxiproxy.ApiServer
	proxies map[[2]string]*toxiproxy.Proxy // (from node id, to raft address)
	raftOf  map[string]string              // node id → its raft address
	cut     map[string]bool
}

// NewNetwork returns a network with no proxies yet; Use installs it.
func NewNetwork() *Network {
	return &Network{
		api:     toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()),
		proxies: map[[2]string]*toxiproxy.Proxy{},
		raftOf:  map[string]string{},
		cut:     map[string]bool{},
	}
}

// Use makes the cluster's nodes dial each other's Raft ports through the
// network. Call it before New starts nodes (set as Cluster.Mutate).
func (nw *Network) Use(o *server.Options) {
	from := o.Raft.NodeID
	o.Raft.Dial = func(addr string, timeout time.Duration) (net.Conn, error) {
		p, err := nw.proxy(from, addr)
		if err != nil {
			return nil, err
		}
		return net.DialTimeout("tcp", p, timeout)
	}
}

// proxy returns the listen address of the proxy from node `from` to addr,
// creating it on first use.
func (nw *Network) proxy(from, addr string) (string, error) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	k := [2]string{from, addr}
	if p, ok := nw.proxies[k]; ok {
		return p.Listen, nil
	}
	p := toxiproxy.NewProxy(nw.api, fmt.Sprintf("%s->%s", from, addr), "127.0.0.1:0", addr)
	if !nw.cut[from] && !nw.cut[nw.idOf(addr)] {
		if err := p.Start(); err != nil {
			return "", fmt.Errorf("start proxy %s: %w", p.Name, err)
		}
	}
	nw.proxies[k] = p
	return p.Listen, nil
}

func (nw *Network) idOf(addr string) string {
	for id, a := range nw.raftOf {
		if a == addr {
			return id
		}
	}
	return ""
}

// Register tells the network which Raft address belongs to which node.
func (nw *Network) Register(c *Cluster) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	for _, n := range c.Nodes {
		nw.raftOf[n.ID] = n.RaftAddr
	}
}

// Isolate cuts every Raft connection from and to node id.
func (nw *Network) Isolate(id string) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	nw.cut[id] = true
	for k, p := range nw.proxies {
		if k[0] == id || nw.idOf(k[1]) == id {
			p.Stop()
		}
	}
}

// Heal reconnects node id.
func (nw *Network) Heal(id string) error {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	delete(nw.cut, id)
	for k, p := range nw.proxies {
		if (k[0] == id || nw.idOf(k[1]) == id) && !nw.cut[k[0]] && !nw.cut[nw.idOf(k[1])] {
			if err := p.Start(); err != nil && !errors.Is(err, toxiproxy.ErrProxyAlreadyStarted) {
				return fmt.Errorf("restart proxy %s: %w", p.Name, err)
			}
		}
	}
	return nil
}

// Close stops every proxy.
func (nw *Network) Close() {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	for _, p := range nw.proxies {
		p.Stop()
	}
}
