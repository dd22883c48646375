package kafka

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ListedBrokerWait bounds the request ListedBrokers makes of each broker
// when it is asked for the brokers a new client starts from: a broker
// that answers takes milliseconds.
const ListedBrokerWait = 2 * time.Second

// ListedBrokers asks each of brokers, all at once, for the cluster's
// metadata and returns the addresses of the brokers the first answer
// lists. A broker paused or cut off (the cluster fenced it and runs on)
// accepts connections and never answers: asked one after the other, as
// a client asks its seeds, it would hold every request that picks it for
// the client's request timeout (10 s). wait, when above 0, bounds each
// request; ctx bounds them all. A broker that refuses the login or the
// TLS handshake ends the wait with its error within refusalGrace, unless
// another broker answers by then. Without an answer it
// returns nil and the errors of the brokers that answered with one, or,
// when none answered at all (no connection, or no answer in time), the
// first error.
func ListedBrokers(ctx context.Context, brokers []*kgo.Broker, wait time.Duration) ([]string, error) {
	return askBrokers(ctx, brokers, wait, func(err error) bool { return SASLRefused(err) || isTLSError(err) })
}

// refusalGrace is how long askBrokers waits, after a broker's refusal,
// for another broker's answer. Every broker refuses a wrong password, but
// the error that says so may not: some close the connection instead,
// as does a broker shutting down or a proxy before a broker that is down,
// faster than another broker serves the login.
const refusalGrace = time.Second

// askBrokers is ListedBrokers, ending the wait refusalGrace after the
// first error for which final is true, with that error, unless a broker
// answers first.
func askBrokers(ctx context.Context, brokers []*kgo.Broker, wait time.Duration, final func(error) bool) ([]string, error) {
	if len(brokers) == 0 {
		return nil, errors.New("kafka: no broker to ask for the cluster's brokers")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the requests still waiting end
	type answer struct {
		addrs []string
		err   error
	}
	answers := make(chan answer, len(brokers))
	for _, b := range brokers {
		go func() {
			rctx, rcancel := ctx, context.CancelFunc(func() {})
			if wait > 0 {
				rctx, rcancel = context.WithTimeout(ctx, wait)
			}
			defer rcancel()
			req := kmsg.NewPtrMetadataRequest()
			req.Topics = []kmsg.MetadataRequestTopic{} // brokers only
			resp, err := b.Request(rctx, req)
			if err != nil {
				answers <- answer{err: err}
				return
			}
			var out []string
			for _, m := range resp.(*kmsg.MetadataResponse).Brokers {
				out = append(out, net.JoinHostPort(m.Host, strconv.Itoa(int(m.Port))))
			}
			if len(out) == 0 {
				err = errors.New("kafka: the cluster's metadata lists no broker")
			}
			answers <- answer{out, err}
		}()
	}
	var first, refusal error
	var answered []error
	var grace <-chan time.Time
	for range brokers {
		var a answer
		select {
		case a = <-answers:
		case <-grace:
			return nil, refusal
		}
		switch {
		case a.err == nil:
			return a.addrs, nil
		case final(a.err):
			if refusal == nil {
				refusal = a.err
				t := time.NewTimer(refusalGrace)
				defer t.Stop()
				grace = t.C
			}
			continue
		case first == nil:
			first = a.err
		}
		if !notAnswered(a.err) {
			answered = append(answered, a.err)
		}
	}
	if refusal != nil {
		return nil, refusal
	}
	if len(answered) > 0 {
		return nil, errors.Join(answered...)
	}
	return nil, first
}

// notAnswered reports an error of a broker that did not answer: no
// connection (unreachable), or no answer in time.
func notAnswered(err error) bool {
	var ne net.Error
	return unreachable(err) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// NewListedClient returns a client connected as c says, with opts
// appended, for a short task (a check at start, a lag computation): its
// seeds are the brokers the cluster lists, asked of c's seeds all at
// once (ListedBrokers, each within ListedBrokerWait), so that none of its
// requests waits on a seed that does not answer; c's seeds when none
// answers. A client that lives on keeps c's seeds instead (NewClient),
// its way back to a cluster whose brokers all changed address.
func NewListedClient(ctx context.Context, c Config, opts ...kgo.Opt) (*kgo.Client, error) {
	cl, err := NewClient(c, opts...)
	if err != nil {
		return nil, err
	}
	if listed, _ := ListedBrokers(ctx, cl.SeedBrokers(), ListedBrokerWait); len(listed) > 0 {
		if err := cl.UpdateSeedBrokers(listed...); err != nil {
			cl.Close()
			return nil, fmt.Errorf("kafka: client: %w", err)
		}
	}
	return cl, nil
}

// ListedSeeds returns the brokers the cluster lists now, asked of c's
// seeds all at once (ListedBrokers, each within ListedBrokerWait, ctx
// bounding them all), or nil when none answers: the seeds a client that
// must start at once takes instead of c's (session.Loop.Open). A seed
// paused or cut off (the cluster fenced it, and lists only the brokers
// that serve) is not among them.
func ListedSeeds(ctx context.Context, c Config) []string {
	cl, err := c.pingClient()
	if err != nil {
		return nil
	}
	defer cl.Close()
	out, _ := ListedBrokers(ctx, cl.SeedBrokers(), ListedBrokerWait)
	return out
}
