package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/producer"
)

// ProduceConfig configures Produce.
type ProduceConfig struct {
	// Events per run.
	Events int
	// Partitions of each benchmark topic.
	Partitions int32
	// Rounds; each runs the baseline and the produce path once, in
	// alternating order.
	Rounds int
	// Linger is the producer linger, the same for both.
	Linger time.Duration
	// Customers is the number of distinct customers in the events.
	Customers int
	// JSON prints the result as JSON too.
	JSON bool
	// Path is the code path of `meterline produce`. Required.
	Path ProducePath
}

// ProducePath sends the NDJSON events of in with p, as `meterline produce`
// does, and returns how many the brokers acknowledged and how long it
// took; an event refused or not acknowledged is an error.
type ProducePath func(ctx context.Context, in io.Reader, p *producer.Producer) (sent int, elapsed time.Duration, err error)

// Validate reports every problem with the config.
func (c *ProduceConfig) Validate() error {
	return errors.Join(positive("events", c.Events), positive("partitions", int(c.Partitions)),
		positive("rounds", c.Rounds), positive("customers", c.Customers), required("path", c.Path != nil))
}

// Produce measures `meterline produce` against raw franz-go producing the
// same pre-encoded records with the same client options, each run into a
// topic of its own.
func Produce(ctx context.Context, env *Env, cfg ProduceConfig) (err error) {
	left, err := newLeftovers(env, cfg.Validate)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, left.remove()) }()
	dir, err := os.MkdirTemp("", "meterline-bench-")
	if err != nil {
		return err
	}
	left.dir(dir)
	b := &produceBench{env: env, cfg: cfg, left: left, file: filepath.Join(dir, "events.ndjson"),
		popts: env.producerOptions(producer.WithLinger(cfg.Linger))}
	env.say("writing %d events to %s", cfg.Events, b.file)
	if err := writeProduceEvents(b.file, cfg.Events, cfg.Customers, time.Now()); err != nil {
		return err
	}
	// The baseline's records are exactly the bytes the produce path sends.
	if b.recs, err = preEncode(b.file, b.popts); err != nil {
		return err
	}
	rounds := Rounds{N: cfg.Rounds, Unit: "events", Progress: env.say}
	res, err := rounds.Run(ctx, rawProduce{b}, pathProduce{b})
	if err != nil {
		return err
	}
	mb, mp := res.Median(0), res.Median(1)
	fmt.Fprintf(env.Out, "events: %d per run, %d partitions, %d rounds (medians)\n", cfg.Events, cfg.Partitions, cfg.Rounds)
	writeAligned(env.Out,
		"baseline raw franz-go:", fmt.Sprintf("%.0f events/s", mb),
		"meterline produce:", fmt.Sprintf("%.0f events/s", mp),
		"ratio:", fmt.Sprintf("%.2f", mp/mb))
	if !cfg.JSON {
		return nil
	}
	return json.NewEncoder(env.Out).Encode(map[string]any{"baseline_median": mb, "produce_median": mp, "ratio": mp / mb,
		"baseline": res.JSON(0, "raw-franz-go"), "produce": res.JSON(1, "meterline-produce")})
}

type produceBench struct {
	env   *Env
	cfg   ProduceConfig
	left  *leftovers
	file  string            // the events, NDJSON
	recs  []*kgo.Record     // the events as the produce path encodes them
	popts []producer.Option // the options of both
}

// topic creates the topic of one run.
func (b *produceBench) topic(ctx context.Context, what string, round int) (string, error) {
	name := fmt.Sprintf("%sbench-%s-%d-%d", b.env.Topics.Prefix, what, time.Now().UnixNano(), round)
	lat := "LogAppendTime"
	return name, b.left.createTopic(ctx, name, b.cfg.Partitions, map[string]*string{"message.timestamp.type": &lat})
}

// rawProduce is the baseline: the pre-encoded records produced with a
// bare franz-go client configured exactly as the producer's.
type rawProduce struct{ b *produceBench }

func (r rawProduce) Run(ctx context.Context, round int, _ bool) (Result, error) {
	topic, err := r.b.topic(ctx, "base", round)
	if err != nil {
		return Result{}, err
	}
	defer r.b.left.drop(things{topics: []string{topic}})
	cl, err := kgo.NewClient(append(producer.ClientOptions(r.b.popts...), kgo.DefaultProduceTopic(topic))...)
	if err != nil {
		return Result{}, err
	}
	defer cl.Close()
	if err := cl.Ping(ctx); err != nil {
		return Result{}, err
	}
	var failed atomic.Int64
	start := time.Now()
	for _, rec := range r.b.recs {
		cl.Produce(ctx, &kgo.Record{Topic: topic, Key: rec.Key, Value: rec.Value}, func(_ *kgo.Record, err error) {
			if err != nil {
				failed.Add(1)
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return Result{}, err
	}
	elapsed := time.Since(start)
	if f := failed.Load(); f > 0 {
		return Result{}, fmt.Errorf("baseline: %d sends failed", f)
	}
	return Result{Name: "baseline (raw franz-go)", Count: len(r.b.recs), Elapsed: elapsed}, nil
}

// pathProduce runs the code path of `meterline produce` on the file.
type pathProduce struct{ b *produceBench }

func (r pathProduce) Run(ctx context.Context, round int, _ bool) (Result, error) {
	topic, err := r.b.topic(ctx, "produce", round)
	if err != nil {
		return Result{}, err
	}
	defer r.b.left.drop(things{topics: []string{topic}})
	p, err := producer.New(append(r.b.popts, producer.WithTopic(topic), producer.WithLogger(r.b.env.Logger))...)
	if err != nil {
		return Result{}, err
	}
	defer p.Close()
	if err := p.Client().Ping(ctx); err != nil {
		return Result{}, err
	}
	f, err := os.Open(r.b.file)
	if err != nil {
		return Result{}, err
	}
	defer f.Close()
	sent, elapsed, err := r.b.cfg.Path(ctx, f, p)
	if err != nil {
		return Result{}, err
	}
	return Result{Name: "meterline produce", Count: sent, Elapsed: elapsed}, nil
}

// preEncode returns the events of the NDJSON file as the producer encodes
// them.
func preEncode(path string, popts []producer.Option) ([]*kgo.Record, error) {
	p, err := producer.New(popts...)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 1<<20)
	var recs []*kgo.Record
	for sc.Scan() {
		if len(sc.Bytes()) == 0 {
			continue
		}
		e, err := producer.ParseJSON(sc.Bytes())
		if err != nil {
			return nil, err
		}
		r, err := p.Record(e)
		if err != nil {
			return nil, err
		}
		recs = append(recs, r)
	}
	return recs, sc.Err()
}
