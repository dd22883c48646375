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

	"github.com/twmb/franz-go/pkg/kerr"
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
	Timeout time.Duration `help:"How long an event may wait for Kafka's acknowledgement (brokers unreachable) before it is reported failed; 0: no bound." default:"${produce_timeout}"`
}

// defaultProduceTimeout is --timeout's default: an outage of brokers this
// long fails the events still waiting, rather than hold the command for
// ever.
const defaultProduceTimeout = 2 * time.Minute

// produceStopGrace bounds the wait for the acknowledgement of the events
// already handed to Kafka once the command is told to stop (SIGINT,
// SIGTERM): past it, they are counted as not acknowledged.
const produceStopGrace = 10 * time.Second

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
		producer.WithClientOptions(kgo.RecordDeliveryTimeout(c.Timeout)),
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
	if sum.Bad > 0 || sum.Failed > 0 || sum.Unacked > 0 || sum.Err != nil {
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
	Lines  int64 // non-empty lines read
	Sent   int64 // acknowledged by the brokers
	Bad    int64 // lines refused before sending
	Failed int64 // sends the brokers did not acknowledge
	// Unacked are the sends neither acknowledged nor failed when the
	// command was told to stop (produceStopGrace): they may have been
	// written.
	Unacked int64
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
	if s.Unacked > 0 {
		out += fmt.Sprintf("; stopped with %d not acknowledged by Kafka: they may have been written; sending the same lines again is safe (dedup drops the copies)", s.Unacked)
	}
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
	size  int           // bytes of lines
	recs  []*kgo.Record // nil entry: the line was bad or empty
	errs  []error
	done  chan struct{}
}

// A chunk is handed to the encoders at chunkLines lines, or once its
// lines hold chunkBytes: the chunks queued for them (about twice
// GOMAXPROCS) then hold megabytes, not 512 lines of maxLineBytes each.
const (
	chunkLines = 512
	chunkBytes = 1 << 20
)

// Produce reads NDJSON events from in and sends them with p, in input
// order. Lines are parsed and validated on several goroutines; records are
// produced from one, so events keep their order per partition. Bad lines
// are reported to opts.Errors with their line number and the field at fault.
// Produce returns when every queued event is acknowledged or failed, or,
// once ctx ended, after produceStopGrace at most; if it is still waiting
// for room in p's buffer then, it closes p.
func Produce(ctx context.Context, in io.Reader, p *producer.Producer, opts ProduceOptions) ProduceSummary {
	r := &produceRun{p: p, opts: opts, start: time.Now()}
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
	readErr := make(chan error, 1)
	go r.read(ctx, in, jobs, ordered, readErr)

	var stopProgress func()
	if opts.Progress != nil {
		stopProgress = progress(opts.Progress, &r.errMu, r.start, &r.sent, &r.failed, &r.sum.Bad)
	}
	// The events already handed to Kafka are waited for, also once ctx
	// ended, but then for produceStopGrace at most: brokers that do not
	// answer would hold the command for ever (--timeout, when set, fails
	// them sooner). A sender still waiting for room in the producer's
	// buffer then is released by closing the producer, which fails what
	// it holds.
	fctx, fcancel := context.WithCancel(context.WithoutCancel(ctx))
	stopFlush := context.AfterFunc(ctx, func() { time.AfterFunc(produceStopGrace, fcancel) })
	var sent atomic.Bool
	stopSend := context.AfterFunc(fctx, func() {
		if !sent.Load() {
			r.closed.Store(true)
			p.Close()
		}
	})
	r.send(ordered)
	sent.Store(true)
	wg.Wait()
	ferr := p.Flush(fctx)
	stopFlush()
	stopSend()
	fcancel()
	if ferr != nil && ctx.Err() == nil {
		r.sum.Err = ferr
	}
	select {
	case err := <-readErr:
		r.sum.Err = errors.Join(r.sum.Err, err)
	default:
	}
	if stopProgress != nil {
		stopProgress()
	}
	r.errMu.Lock()
	r.returned = true
	r.errMu.Unlock()
	r.sum.Sent, r.sum.Failed = r.sent.Load(), r.failed.Load()
	if ferr != nil {
		r.sum.Unacked = max(0, r.queued.Load()-r.sum.Sent-r.sum.Failed)
	}
	r.sum.Elapsed = time.Since(r.start)
	return r.sum
}

// produceRun is one run of Produce: its counts, and the flag that stops
// the reader (a bad line with Strict).
type produceRun struct {
	p      *producer.Producer
	opts   ProduceOptions
	start  time.Time
	sum    ProduceSummary // Bad and Lines are updated atomically
	queued atomic.Int64   // handed to the producer
	sent   atomic.Int64
	failed atomic.Int64
	errMu  sync.Mutex // serializes writes to opts.Errors and the progress line
	// returned is set, under errMu, when Produce returns: opts.Errors is
	// its caller's again, and a send failed later (the producer closed
	// with events not acknowledged, which the summary counts) is not
	// reported there.
	returned bool
	stopRead atomic.Bool
	closed   atomic.Bool // the producer was closed: the lines left are not sent
}

// report writes a bad line's or a failed send's error to opts.Errors.
func (r *produceRun) report(line int64, err error) {
	if r.opts.Errors == nil {
		return
	}
	r.errMu.Lock()
	defer r.errMu.Unlock()
	if r.returned {
		return
	}
	if r.opts.Progress != nil {
		fmt.Fprint(r.opts.Errors, "\r\033[K")
	}
	// The error may repeat a property's name: a terminal must show it,
	// not act on it (docs/producing.md, Go: the producer library).
	fmt.Fprintf(r.opts.Errors, "line %d: %s\n", line, terminalText(err.Error()))
}

// read splits in into chunks of lines, each handed to the encoders (jobs)
// and, in input order, to the sender (ordered), until in ends, ctx ends or
// stopRead is set; then it closes both. An error reading in, ctx ending,
// or both, is sent on readErr, once. Once ctx ended it stops at once, also
// while a read of in waits for input (stopReader).
func (r *produceRun) read(ctx context.Context, in io.Reader, jobs, ordered chan<- *chunk, readErr chan<- error) {
	defer close(ordered)
	defer close(jobs)
	br := bufio.NewReaderSize(&stopReader{ctx: ctx, r: in, res: make(chan readResult, 1)}, 1<<20)
	var rerr error
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
	for !r.stopRead.Load() && ctx.Err() == nil {
		b, err := readLine(br)
		// A line ends at its newline, or at the end of the input; the part
		// read before an error (a stop, a failed read) is no line.
		if err == nil || errors.Is(err, errLineTooLong) {
			line++
			cur.lines = append(cur.lines, inputLine{b: bytes.Clone(b), tooLong: errors.Is(err, errLineTooLong)})
			cur.size += len(b)
			// A full chunk goes to the encoders; so does a partial one
			// when no more input is waiting (a slow stream, `tail -f |`):
			// its lines are sent now, not once 512 have arrived.
			if len(cur.lines) == chunkLines || cur.size >= chunkBytes || br.Buffered() == 0 {
				flush()
			}
		}
		if err != nil && !errors.Is(err, errLineTooLong) {
			if !errors.Is(err, io.EOF) && ctx.Err() == nil {
				rerr = fmt.Errorf("read input at line %d: %w", line+1, err)
			}
			break
		}
	}
	flush()
	if err := ctx.Err(); err != nil {
		rerr = errors.Join(rerr, fmt.Errorf("interrupted: %w", err))
	}
	if rerr != nil {
		readErr <- rerr
	}
}

// stopReader reads r until ctx ends, then returns ctx's error, also from a
// Read of r still waiting for input (an open, idle pipe; a terminal): a
// stop signal must not wait for the next line. That Read goes on in its
// goroutine until r returns, and what it read is dropped: the command
// stops reading there.
type stopReader struct {
	ctx context.Context
	r   io.Reader
	buf []byte
	res chan readResult
}

type readResult struct {
	n   int
	err error
}

func (s *stopReader) Read(p []byte) (int, error) {
	if err := s.ctx.Err(); err != nil {
		return 0, err
	}
	if cap(s.buf) < len(p) {
		s.buf = make([]byte, len(p))
	}
	buf := s.buf[:len(p)]
	go func() {
		n, err := s.r.Read(buf)
		s.res <- readResult{n, err}
	}()
	select {
	case res := <-s.res:
		return copy(p, buf[:res.n]), res.err
	case <-s.ctx.Done():
		return 0, s.ctx.Err()
	}
}

// send queues the records of the encoded chunks in input order. With
// Strict, the first bad line stops the reader; the chunks already read are
// drained and their lines not sent.
func (r *produceRun) send(ordered <-chan *chunk) {
	for c := range ordered {
		<-c.done
		for i, rec := range c.recs {
			if r.closed.Load() {
				break
			}
			ln := c.first + int64(i)
			if c.errs[i] != nil {
				atomic.AddInt64(&r.sum.Bad, 1)
				atomic.AddInt64(&r.sum.Lines, 1)
				r.report(ln, c.errs[i])
				if r.opts.Strict {
					r.stopRead.Store(true)
					break
				}
				continue
			}
			if rec == nil {
				continue // empty line
			}
			atomic.AddInt64(&r.sum.Lines, 1)
			r.queued.Add(1)
			r.p.ProduceRecord(rec, func(err error) {
				if err != nil {
					r.failed.Add(1)
					r.report(ln, refusedWrite(err, rec.Topic))
					return
				}
				r.sent.Add(1)
			})
		}
		if r.stopRead.Load() || r.closed.Load() {
			for c := range ordered {
				<-c.done
			}
			return
		}
	}
}

// refusedWrite names the topic and the ACL a produce refused for want of
// authorization needs: TOPIC_AUTHORIZATION_FAILED (no Write, or not even
// Describe, on the topic), or CLUSTER_AUTHORIZATION_FAILED from the
// idempotent producer's InitProducerID, which a principal may send once it
// has Write on some topic (or IdempotentWrite on the cluster).
func refusedWrite(err error, topic string) error {
	if errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.ClusterAuthorizationFailed) {
		return fmt.Errorf("topic %s: %w (the principal needs Write on topic %s: docs/operations.md, Security and ACLs)", topic, err, topic)
	}
	return err
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
