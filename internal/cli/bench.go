package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/producer"
)

// BenchCmd is `meterline bench`.
type BenchCmd struct {
	Produce   BenchProduceCmd   `cmd:"" help:"meterline produce against raw franz-go producing the same pre-encoded records."`
	Dedup     BenchDedupCmd     `cmd:"" help:"The dedup stage on pre-filled input against two transactional passthrough baselines."`
	Sink      BenchSinkCmd      `cmd:"" help:"meterline sink against a bare clickhouse-go batch loop writing the same rows."`
	Aggregate BenchAggregateCmd `cmd:"" help:"The aggregator on pre-filled usage.deduped against two transactional passthrough baselines."`
}

// BenchProduceCmd is `meterline bench produce`.
type BenchProduceCmd struct {
	Events     int           `help:"Events per run." default:"1000000"`
	Partitions int32         `help:"Partitions of each benchmark topic." default:"16"`
	Rounds     int           `help:"Rounds; each runs the baseline and produce once, in alternating order. Medians are reported." default:"3"`
	Linger     time.Duration `help:"Producer linger, the same for both." default:"5ms"`
	Customers  int           `help:"Distinct customers in the generated events." default:"10000"`
	JSON       bool          `help:"Print the result as JSON too."`
}

// BenchResult is one measured run.
type BenchResult struct {
	Name    string  `json:"name"`
	Events  int     `json:"events"`
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"events_per_second"`
}

// Run runs the benchmark.
func (c *BenchProduceCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	dir, err := os.MkdirTemp("", "meterline-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "events.ndjson")
	fmt.Fprintf(stdio.Stderr, "bench: writing %d events to %s\n", c.Events, file)
	if err := writeBenchEvents(file, c.Events, c.Customers, time.Now()); err != nil {
		return err
	}
	kc, err := g.connectKafka(ctx)
	if err != nil {
		return err
	}
	popts, err := producerConn(kc)
	if err != nil {
		return err
	}
	popts = append(popts, producer.WithLinger(c.Linger))

	// The baseline's records are exactly the bytes the produce path sends.
	recs, err := preEncode(file, popts)
	if err != nil {
		return err
	}
	adm, closeAdm, err := adminClient(ctx, g)
	if err != nil {
		return err
	}
	defer closeAdm()

	var base, prod []BenchResult
	for round := 0; round < c.Rounds; round++ {
		runBase := func() error {
			topic, err := benchTopic(ctx, adm, g, c.Partitions, "base", round)
			if err != nil {
				return err
			}
			r, err := benchRaw(ctx, recs, topic, popts)
			_, _ = adm.DeleteTopics(ctx, topic)
			if err != nil {
				return err
			}
			base = append(base, r)
			fmt.Fprintf(stdio.Stderr, "bench: round %d baseline (raw franz-go): %.0f events/s\n", round+1, r.Rate)
			return nil
		}
		runProd := func() error {
			topic, err := benchTopic(ctx, adm, g, c.Partitions, "produce", round)
			if err != nil {
				return err
			}
			r, err := benchProduce(ctx, file, topic, popts, log)
			_, _ = adm.DeleteTopics(ctx, topic)
			if err != nil {
				return err
			}
			prod = append(prod, r)
			fmt.Fprintf(stdio.Stderr, "bench: round %d meterline produce:        %.0f events/s\n", round+1, r.Rate)
			return nil
		}
		order := []func() error{runBase, runProd}
		if round%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		for _, f := range order {
			if err := f(); err != nil {
				return err
			}
		}
	}
	mb, mp := median(base), median(prod)
	fmt.Fprintf(stdio.Stdout, "events: %d per run, %d partitions, %d rounds (medians)\n", c.Events, c.Partitions, c.Rounds)
	fmt.Fprintf(stdio.Stdout, "baseline raw franz-go: %.0f events/s\n", mb)
	fmt.Fprintf(stdio.Stdout, "meterline produce:     %.0f events/s\n", mp)
	fmt.Fprintf(stdio.Stdout, "ratio:                 %.2f\n", mp/mb)
	if c.JSON {
		return json.NewEncoder(stdio.Stdout).Encode(map[string]any{
			"baseline_median": mb, "produce_median": mp, "ratio": mp / mb, "baseline": base, "produce": prod})
	}
	return nil
}

func median(rs []BenchResult) float64 {
	if len(rs) == 0 {
		return 0
	}
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = r.Rate
	}
	sort.Float64s(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func benchTopic(ctx context.Context, adm *kadm.Client, g *Globals, partitions int32, what string, round int) (string, error) {
	name := fmt.Sprintf("%sbench-%s-%d-%d", g.Topic.Prefix, what, time.Now().UnixNano(), round)
	lat := "LogAppendTime"
	resp, err := adm.CreateTopic(ctx, partitions, -1, map[string]*string{"message.timestamp.type": &lat}, name)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return "", fmt.Errorf("create %s: %w", name, err)
	}
	return name, nil
}

func writeBenchEvents(path string, n, customers int, now time.Time) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	meters := []string{"api_calls", "tokens", "storage_bytes", "compute_ms", "egress_bytes"}
	base := now.Add(-30 * time.Minute)
	for i := 0; i < n; i++ {
		e := producer.Event{
			EventID:    producer.EventID("bench", fmt.Sprint(i)),
			CustomerID: fmt.Sprintf("cust-%05d", i%customers),
			Meter:      meters[i%len(meters)],
			Quantity:   int64(1 + i%100),
			EventTime:  base.Add(time.Duration(i%1_000_000) * time.Millisecond),
			Source:     "bench",
			Properties: map[string]string{"region": []string{"eu-west-1", "us-east-1"}[i%2]},
		}
		b, err := e.MarshalJSON()
		if err != nil {
			return err
		}
		w.Write(b)
		w.WriteByte('\n')
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Close()
}

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
	br := bufio.NewReaderSize(f, 1<<20)
	var recs []*kgo.Record
	for {
		b, err := readLine(br)
		if len(b) > 0 {
			e, perr := producer.ParseJSON(b)
			if perr != nil {
				return nil, perr
			}
			r, perr := p.Record(e)
			if perr != nil {
				return nil, perr
			}
			recs = append(recs, r)
		}
		if err == io.EOF {
			return recs, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// benchRaw produces the pre-encoded records with a bare franz-go client
// configured exactly as the producer's.
func benchRaw(ctx context.Context, recs []*kgo.Record, topic string, popts []producer.Option) (BenchResult, error) {
	opts := append(producer.ClientOptions(popts...), kgo.DefaultProduceTopic(topic))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return BenchResult{}, err
	}
	defer cl.Close()
	if err := cl.Ping(ctx); err != nil {
		return BenchResult{}, err
	}
	var failed atomic.Int64
	start := time.Now()
	for _, r := range recs {
		rr := &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value}
		cl.Produce(ctx, rr, func(_ *kgo.Record, err error) {
			if err != nil {
				failed.Add(1)
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return BenchResult{}, err
	}
	el := time.Since(start)
	if f := failed.Load(); f > 0 {
		return BenchResult{}, fmt.Errorf("baseline: %d sends failed", f)
	}
	return BenchResult{Name: "raw-franz-go", Events: len(recs), Seconds: el.Seconds(), Rate: float64(len(recs)) / el.Seconds()}, nil
}

// benchProduce runs the code path of `meterline produce` on the file.
func benchProduce(ctx context.Context, file, topic string, popts []producer.Option, log *zap.Logger) (BenchResult, error) {
	p, err := producer.New(append(popts, producer.WithTopic(topic), producer.WithLogger(log))...)
	if err != nil {
		return BenchResult{}, err
	}
	defer p.Close()
	if err := p.Client().Ping(ctx); err != nil {
		return BenchResult{}, err
	}
	f, err := os.Open(file)
	if err != nil {
		return BenchResult{}, err
	}
	defer f.Close()
	sum := Produce(ctx, f, p, ProduceOptions{Errors: io.Discard})
	if sum.Bad > 0 || sum.Failed > 0 || sum.Err != nil {
		return BenchResult{}, fmt.Errorf("produce path: %s", sum)
	}
	return BenchResult{Name: "meterline-produce", Events: int(sum.Sent), Seconds: sum.Elapsed.Seconds(),
		Rate: float64(sum.Sent) / sum.Elapsed.Seconds()}, nil
}
