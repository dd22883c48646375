package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/topics"
)

// TopicsCmd is `meterline topics`.
type TopicsCmd struct {
	Create TopicsCreateCmd `cmd:"" help:"Create every topic that does not exist yet, then check all of them."`
	Check  TopicsCheckCmd  `cmd:"" help:"Report every difference between the cluster's topics and what Meterline needs; exit 1 on drift."`
}

// TopicsCreateCmd is `meterline topics create`.
type TopicsCreateCmd struct {
	topics.Layout `embed:""`
	Timeout       time.Duration `help:"Deadline for the whole command." default:"60s"`
}

// TopicsCheckCmd is `meterline topics check`.
type TopicsCheckCmd struct {
	topics.Layout `embed:""`
	Timeout       time.Duration `help:"Deadline for the whole command." default:"60s"`
}

// adminClient checks the Kafka credentials and returns an admin client.
func adminClient(ctx context.Context, g *Globals) (*kadm.Client, func(), error) {
	adm, cl, err := kafkaClients(ctx, g)
	if err != nil {
		return nil, nil, err
	}
	return adm, cl.Close, nil
}

// kafkaClients checks the Kafka credentials and returns an admin client and
// the client under it; the caller closes the client.
func kafkaClients(ctx context.Context, g *Globals) (*kadm.Client, *kgo.Client, error) {
	kc, err := g.connectKafka(ctx)
	if err != nil {
		return nil, nil, err
	}
	cl, err := kafka.NewClient(kc)
	if err != nil {
		return nil, nil, err
	}
	return kadm.NewClient(cl), cl, nil
}

// Run creates the topics.
func (c *TopicsCreateCmd) Run(ctx context.Context, g *Globals, stdio IO) error {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	adm, cl, err := kafkaClients(ctx, g)
	if err != nil {
		return err
	}
	defer cl.Close()
	layout, err := resolveLayout(ctx, adm, cl, c.Layout, stdio)
	if err != nil {
		return err
	}
	specs := topics.Specs(g.Topic, layout)
	res, err := topics.Create(ctx, adm, specs, layout.ReplicationFactor)
	if err == nil {
		// Stages started right after this command may ask any broker.
		names := make([]string, len(specs))
		for i, s := range specs {
			names[i] = s.Name
		}
		err = topics.WaitVisibleEverywhere(ctx, cl, names...)
	}
	for _, r := range res {
		switch {
		case r.Err != nil:
			fmt.Fprintf(stdio.Stdout, "failed   %s: %v\n", r.Name, r.Err)
		case r.Created:
			fmt.Fprintf(stdio.Stdout, "created  %s\n", r.Name)
		default:
			fmt.Fprintf(stdio.Stdout, "exists   %s\n", r.Name)
		}
	}
	if err != nil {
		return &ExitError{Code: 1, Err: err}
	}
	return reportDrift(ctx, adm, specs, layout.ReplicationFactor, stdio)
}

// Run checks the topics.
func (c *TopicsCheckCmd) Run(ctx context.Context, g *Globals, stdio IO) error {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	adm, cl, err := kafkaClients(ctx, g)
	if err != nil {
		return err
	}
	defer cl.Close()
	layout, err := resolveLayout(ctx, adm, cl, c.Layout, stdio)
	if err != nil {
		return err
	}
	return reportDrift(ctx, adm, topics.Specs(g.Topic, layout), layout.ReplicationFactor, stdio)
}

// resolveLayout decides the replication for the cluster's broker count,
// the brokers that are down included (topics.Layout.Resolve), and says
// what it decided.
func resolveLayout(ctx context.Context, adm *kadm.Client, cl *kgo.Client, l topics.Layout, stdio IO) (topics.Layout, error) {
	b, err := topics.ClusterBrokers(ctx, adm, cl)
	if err != nil {
		return l, err
	}
	l, err = l.Resolve(b.Registered)
	if err != nil {
		return l, &ExitError{Code: 2, Err: err}
	}
	fmt.Fprintf(stdio.Stdout, "cluster  %s: replication factor %d, min.insync.replicas %d\n", b, l.ReplicationFactor, l.MinInsyncReplicas)
	return l, nil
}

// reportDrift prints every drift of the topics, and of Kafka's internal
// topics against the replication factor rf; exit 1 on any.
func reportDrift(ctx context.Context, adm *kadm.Client, specs []topics.Spec, rf int16, stdio IO) error {
	drifts, err := topics.Check(ctx, adm, specs)
	if err != nil {
		return err
	}
	internal, err := topics.CheckInternal(ctx, adm, rf)
	if errors.Is(err, topics.ErrInternalNotAuthorized) {
		// The line names the topics already: the reason without the
		// package's "topics: ".
		fmt.Fprintf(stdio.Stdout, "skipped  Kafka's internal topics: %s\n", strings.TrimPrefix(err.Error(), "topics: "))
	} else if err != nil {
		return err
	}
	drifts = append(drifts, internal...)
	for _, d := range drifts {
		fmt.Fprintf(stdio.Stdout, "drift    %s\n", d)
	}
	if len(drifts) > 0 {
		return &ExitError{Code: 1, Silent: true, Err: fmt.Errorf("%d topic drifts", len(drifts))}
	}
	fmt.Fprintf(stdio.Stdout, "ok       all %d topics match\n", len(specs))
	return nil
}
