package stream

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kadm"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/clock"
)

// seedProxy forwards connections to a broker until silenced; then it
// accepts connections and never answers, as a broker does whose process
// is paused or whose host is cut off, while the cluster runs on without
// it.
type seedProxy struct {
	ln     net.Listener
	to     string
	mu     sync.Mutex
	silent bool
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newSeedProxy(t *testing.T, to string) *seedProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &seedProxy{ln: ln, to: to}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *seedProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns = append(p.conns, c)
		silent := p.silent
		p.mu.Unlock()
		if silent {
			continue
		}
		b, err := net.Dial("tcp", p.to)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, b)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(b, c) }()
		go func() { _, _ = io.Copy(c, b) }()
	}
}

// silence stops answering: new connections are held without a byte, the
// forwarded ones are cut.
func (p *seedProxy) silence() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.silent = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// TestClientsSeededByListedBrokers: the stage's seed broker stops
// answering (paused, its host cut off) while the cluster runs on. The
// client a restore makes for its copy of the changelog starts from the
// brokers the cluster lists, not from that seed: with it, the client's
// first requests wait for the dial or request timeout, and each restore
// of a failover, even of a promoted standby, takes that long
// (docs/operations.md, Standby replicas).
func TestClientsSeededByListedBrokers(t *testing.T) {
	w := newKVWorld(t, nil)
	proxy := newSeedProxy(t, w.brokers[0])
	// The stage's only seed is the proxy; the cluster lists the broker
	// itself.
	w.brokers = []string{proxy.ln.Addr().String()}
	rt, _ := w.startOwner("a", vfs.NewMem(), clock.Real{}, zap.NewNop())
	w.send("k", "v")
	deadline := time.Now().Add(20 * time.Second)
	for owned := 0; owned == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the stage did not take its partition")
		}
		time.Sleep(50 * time.Millisecond)
		rt.EachPartitionStatus(func(int32, bool, int64, string, string) { owned++ })
	}

	proxy.silence()
	c, err := rt.newChangelogCopy(0, "restore", 0, 0, -1, time.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	lctx, lcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer lcancel()
	ends, err := kadm.NewClient(c.cl).ListEndOffsets(lctx, w.changelog)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatalf("a restore's client with the stage's seed broker silent: %v", err)
	}
}
