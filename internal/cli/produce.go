package cli

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/producer"
	"github.com/meterline/meterline/schemas"
)

// ProduceCmd is `meterline produce`.
type ProduceCmd struct {
	File    string        `short:"f" help:"NDJSON file of events; - reads standard input." default:"-" placeholder:"PATH"`
	Quiet   bool          `short:"q" help:"Do not show live progress on a terminal."`
	Strict  bool          `help:"Stop at the first bad line instead of skipping it."`
	Source  string        `help:"Source of events that name none (the producing service)."`
	MaxSkew time.Duration `help:"How far after now an event_time may be." default:"${producer_max_skew}"`
	Linger  time.Duration `help:"How long a partition batch waits for more events." default:"${producer_linger}"`
}

// maxLineBytes bounds one input line; a longer one is reported and skipped.
const maxLineBytes = 1 << 20

// Run sends the events.
func (c *ProduceCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	in := stdio.Stdin
	if c.File != "-" {
		f, err := os.Open(c.File)
		if err != nil {
			return &ExitError{Code: 2, Err: err}
		}
		defer f.Close()
		in = f
	}
	kc, err := g.connectKafka(ctx)
	if err != nil {
		return err
	}
	p, err := newProducer(kc,
		producer.WithTopic(g.Topic.EventsTopic()),
		producer.WithSource(c.Source),
		producer.WithMaxSkew(c.MaxSkew),
		producer.WithLinger(c.Linger),
		producer.WithLogger(log),
	)
	if err != nil {
		return err
	}
	defer p.Close()
	sum := Produce(ctx, in, p, ProduceOptions{
		Strict:   c.Strict,
		Errors:   stdio.Stderr,
		Progress: progressWriter(stdio, c.Quiet),
	})
	fmt.Fprintln(stdio.Stdout, sum)
	if sum.Bad > 0 || sum.Failed > 0 || sum.Err != nil {
		return &ExitError{Code: 1, Silent: true, Err: errors.New(sum.String())}
	}
	return nil
}

func progressWriter(stdio IO, quiet bool) io.Writer {
	if quiet || !stdio.StderrIsTerminal {
		return nil
	}
	return stdio.Stderr
}

// ProduceOptions tune Produce.
type ProduceOptions struct {
	// Strict stops at the first bad line.
	Strict bool
	// Errors receives one line per bad input line or failed send.
	Errors io.Writer
	// Progress, when not nil, receives a live progress line (a terminal).
	Progress io.Writer
}

// ProduceSummary closes a run.
type ProduceSummary struct {
	Lines   int64 // non-empty lines read
	Sent    int64 // acknowledged by the brokers
	Bad     int64 // lines refused before sending
	Failed  int64 // sends the brokers did not acknowledge
	Elapsed time.Duration
	Err     error // reading the input or flushing failed
}

func (s ProduceSummary) String() string {
	rate := 0.0
	if s.Elapsed > 0 {
		rate = float64(s.Sent) / s.Elapsed.Seconds()
	}
	out := fmt.Sprintf("produce: %d lines, %d sent, %d bad, %d failed in %s (%.0f events/s)",
		s.Lines, s.Sent, s.Bad, s.Failed, s.Elapsed.Round(time.Millisecond), rate)
	if s.Err != nil {
		out += "; " + s.Err.Error()
	}
	return out
}

// A chunk of input lines parsed and encoded by one worker.
type inputLine struct {
	b       []byte
	tooLong bool // longer than maxLineBytes; b is nil
}

type chunk struct {
	first int64 // line number of lines[0]
	lines []inputLine
	recs  []*kgo.Record // nil entry: the line was bad or empty
	errs  []error
	done  chan struct{}
}

const chunkLines = 512

// Produce reads NDJSON events from in and sends them with p, in input
// order. Lines are parsed and validated on several goroutines; records are
// produced from one, so events keep their order per partition. Bad lines
// are reported to opts.Errors with their line number and the field at fault.
// Produce returns when every queued event is acknowledged or failed.
func Produce(ctx context.Context, in io.Reader, p *producer.Producer, opts ProduceOptions) ProduceSummary {
	start := time.Now()
	var (
		sum      ProduceSummary
		sent     atomic.Int64
		failed   atomic.Int64
		errMu    sync.Mutex
		stopRead atomic.Bool
	)
	report := func(line int64, err error) {
		if opts.Errors == nil {
			return
		}
		errMu.Lock()
		defer errMu.Unlock()
		if opts.Progress != nil {
			fmt.Fprint(opts.Errors, "\r\033[K")
		}
		fmt.Fprintf(opts.Errors, "line %d: %v\n", line, err)
	}

	workers := runtime.GOMAXPROCS(0)
	jobs := make(chan *chunk, workers)
	ordered := make(chan *chunk, 2*workers)
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range jobs {
				encodeChunk(p, c)
			}
		}()
	}

	// Reader: split the input into chunks of lines.
	readErr := make(chan error, 1)
	go func() {
		defer close(ordered)
		defer close(jobs)
		br := bufio.NewReaderSize(in, 1<<20)
		line := int64(0)
		cur := &chunk{first: 1, done: make(chan struct{})}
		flush := func() {
			if len(cur.lines) == 0 {
				return
			}
			jobs <- cur
			ordered <- cur
			cur = &chunk{first: line + 1, done: make(chan struct{})}
		}
		for !stopRead.Load() && ctx.Err() == nil {
			b, err := readLine(br)
			if len(b) > 0 || err == nil || errors.Is(err, errLineTooLong) {
				line++
				cur.lines = append(cur.lines, inputLine{b: bytes.Clone(b), tooLong: errors.Is(err, errLineTooLong)})
				if len(cur.lines) == chunkLines {
					flush()
				}
			}
			if err != nil && !errors.Is(err, errLineTooLong) {
				if !errors.Is(err, io.EOF) {
					readErr <- fmt.Errorf("read input at line %d: %w", line+1, err)
				}
				break
			}
		}
		flush()
		if err := ctx.Err(); err != nil {
			readErr <- fmt.Errorf("interrupted: %w", err)
		}
	}()

	var stopProgress func()
	if opts.Progress != nil {
		stopProgress = progress(opts.Progress, &errMu, start, &sent, &failed, &sum.Bad)
	}

	// Producer: queue records in input order.
	for c := range ordered {
		<-c.done
		for i, r := range c.recs {
			ln := c.first + int64(i)
			if c.errs[i] != nil {
				atomic.AddInt64(&sum.Bad, 1)
				atomic.AddInt64(&sum.Lines, 1)
				report(ln, c.errs[i])
				if opts.Strict {
					stopRead.Store(true)
					break
				}
				continue
			}
			if r == nil {
				continue // empty line
			}
			atomic.AddInt64(&sum.Lines, 1)
			p.ProduceRecord(r, func(err error) {
				if err != nil {
					failed.Add(1)
					report(ln, err)
					return
				}
				sent.Add(1)
			})
		}
		if stopRead.Load() {
			// Drain the chunks already read; their lines are not sent.
			for c := range ordered {
				<-c.done
			}
			break
		}
	}
	wg.Wait()
	if err := p.Flush(context.WithoutCancel(ctx)); err != nil {
		sum.Err = err
	}
	select {
	case err := <-readErr:
		sum.Err = errors.Join(sum.Err, err)
	default:
	}
	if stopProgress != nil {
		stopProgress()
	}
	sum.Sent, sum.Failed = sent.Load(), failed.Load()
	sum.Elapsed = time.Since(start)
	return sum
}

var errLineTooLong = errors.New("line too long")

// readLine returns the next line without its newline. A line longer than
// maxLineBytes is skipped to its end and returned as errLineTooLong.
func readLine(br *bufio.Reader) ([]byte, error) {
	b, err := br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		for errors.Is(err, bufio.ErrBufferFull) {
			_, err = br.ReadSlice('\n')
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		return nil, errLineTooLong
	}
	b = bytes.TrimRight(b, "\r\n")
	if err != nil && len(b) > 0 && errors.Is(err, io.EOF) {
		return b, nil // last line without a newline
	}
	return b, err
}

func encodeChunk(p *producer.Producer, c *chunk) {
	defer close(c.done)
	c.recs = make([]*kgo.Record, len(c.lines))
	c.errs = make([]error, len(c.lines))
	for i, l := range c.lines {
		if l.tooLong {
			c.errs[i] = &producer.FieldError{Field: "line", Code: schemas.ReasonOversized,
				Reason: fmt.Sprintf("longer than %d bytes", maxLineBytes)}
			continue
		}
		if len(bytes.TrimSpace(l.b)) == 0 {
			continue
		}
		e, err := producer.ParseJSON(l.b)
		if err != nil {
			c.errs[i] = err
			continue
		}
		c.recs[i], c.errs[i] = p.Record(e)
	}
	c.lines = nil
}

func progress(w io.Writer, mu *sync.Mutex, start time.Time, sent, failed *atomic.Int64, bad *int64) func() {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				mu.Lock()
				fmt.Fprint(w, "\r\033[K")
				mu.Unlock()
				return
			case <-t.C:
				el := time.Since(start).Seconds()
				mu.Lock()
				fmt.Fprintf(w, "\r\033[Kproduce: %d sent  %.0f events/s  %d errors",
					sent.Load(), float64(sent.Load())/el, failed.Load()+atomic.LoadInt64(bad))
				mu.Unlock()
			}
		}
	}()
	return func() { close(stop); <-done }
}
