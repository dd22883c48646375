package schemas

// Property is one name/value pair of an event's properties, or of an
// aggregate's group. Lists of them are sorted by name with unique names.
type Property struct {
	Name  string `avro:"name"`
	Value string `avro:"value"`
}

// UsageEvent is a record of usage.events: a customer used Quantity units of
// Meter at EventTime (UTC epoch milliseconds).
type UsageEvent struct {
	EventID    string     `avro:"event_id"`
	CustomerID string     `avro:"customer_id"`
	Meter      string     `avro:"meter"`
	Quantity   int64      `avro:"quantity"`
	EventTime  int64      `avro:"event_time"`
	Source     string     `avro:"source"`
	Properties []Property `avro:"properties"`
}

// Kind implements Message.
func (*UsageEvent) Kind() Kind { return KindUsageEvent }

// Tick is appended by dedup to each usage.events partition it owns (its
// broker timestamp advances the partition watermark), and by the
// aggregator to each usage.entitlements partition it owns under
// TickKey (its broker timestamp says the partition has been read up to
// that time).
type Tick struct {
	InstanceID string `avro:"instance_id"`
}

// Kind implements Message.
func (*Tick) Kind() Kind { return KindTick }

// DedupedEvent is the first accepted copy of an event, in usage.deduped.
type DedupedEvent struct {
	EventID         string     `avro:"event_id"`
	CustomerID      string     `avro:"customer_id"`
	Meter           string     `avro:"meter"`
	Quantity        int64      `avro:"quantity"`
	EventTime       int64      `avro:"event_time"`
	Source          string     `avro:"source"`
	Properties      []Property `avro:"properties"`
	IngestTime      int64      `avro:"ingest_time"`
	SourcePartition int32      `avro:"source_partition"`
	SourceOffset    int64      `avro:"source_offset"`
}

// Kind implements Message.
func (*DedupedEvent) Kind() Kind { return KindDedupedEvent }

// Watermark is forwarded by dedup to every usage.deduped partition: the
// largest arrival time seen on one usage.events partition.
type Watermark struct {
	SourcePartition  int32 `avro:"source_partition"`
	SourcePartitions int32 `avro:"source_partitions"`
	Watermark        int64 `avro:"watermark"`
	// WindowMs is the writer's dedup window W in milliseconds; 0: not
	// stated (written before the field existed).
	WindowMs int64 `avro:"window_ms"`
	// BucketMs is the writer's expiry bucket B in milliseconds; 0: not
	// stated (written before the field existed).
	BucketMs int64 `avro:"bucket_ms"`
	// SkewMs is the writer's skew S in milliseconds; 0: not stated
	// (written before the field existed).
	SkewMs int64 `avro:"skew_ms"`
}

// Kind implements Message.
func (*Watermark) Kind() Kind { return KindWatermark }

// Duplicate is a dropped copy, in usage.duplicates.
type Duplicate struct {
	EventID            string `avro:"event_id"`
	CustomerID         string `avro:"customer_id"`
	Meter              string `avro:"meter"`
	Source             string `avro:"source"`
	Conflict           bool   `avro:"conflict"`
	Quantity           int64  `avro:"quantity"`
	EventTime          int64  `avro:"event_time"`
	OriginalPartition  int32  `avro:"original_partition"`
	OriginalOffset     int64  `avro:"original_offset"`
	OriginalArrival    int64  `avro:"original_arrival"`
	DuplicatePartition int32  `avro:"duplicate_partition"`
	DuplicateOffset    int64  `avro:"duplicate_offset"`
	DuplicateArrival   int64  `avro:"duplicate_arrival"`
}

// Kind implements Message.
func (*Duplicate) Kind() Kind { return KindDuplicate }

// Rejected is bad input parked in usage.rejected with a reason code.
type Rejected struct {
	Reason          string `avro:"reason"`
	Detail          string `avro:"detail"`
	Stage           string `avro:"stage"`
	SourceTopic     string `avro:"source_topic"`
	SourcePartition int32  `avro:"source_partition"`
	SourceOffset    int64  `avro:"source_offset"`
	SourceTimestamp int64  `avro:"source_timestamp"`
	CustomerID      string `avro:"customer_id"`
	Meter           string `avro:"meter"`
	EventID         string `avro:"event_id"`
	// RawKey and RawValue are the source record's key and value, or
	// their first MaxRejectedRawBytes (Bound); RawKeyLength and
	// RawValueLength are the whole lengths and RawKeySHA256 and
	// RawValueSHA256 the digests of the whole bytes. A record written
	// before bounding existed decodes with lengths of -1 and nil digests.
	RawKey         []byte `avro:"raw_key"`
	RawValue       []byte `avro:"raw_value"`
	RawKeyLength   int64  `avro:"raw_key_length"`
	RawKeySHA256   []byte `avro:"raw_key_sha256"`
	RawValueLength int64  `avro:"raw_value_length"`
	RawValueSHA256 []byte `avro:"raw_value_sha256"`
}

// Kind implements Message.
func (*Rejected) Kind() Kind { return KindRejected }

// Stable rejection reason codes (docs/design.md, Bad input), used alike in
// topics, metrics and ClickHouse.
const (
	ReasonUndecodable   = "undecodable"
	ReasonUnknownSchema = "unknown_schema"
	ReasonInvalid       = "invalid"
	ReasonTooOld        = "too_old"
	ReasonInFuture      = "in_future"
	ReasonOversized     = "oversized"
	ReasonUnknownMeter  = "unknown_meter"
	ReasonUninsertable  = "uninsertable"
	// ReasonOverLimit: the event would take its meter past the customer's
	// cap for the period (docs/entitlements.md, Rejections).
	ReasonOverLimit = "over_limit"
	// ReasonNoCredit: the customer's credits cannot pay for the event and
	// the plan allows no (more) overdraft (docs/entitlements.md,
	// Rejections).
	ReasonNoCredit = "no_credit"
)

// Reasons lists every rejection reason code.
var Reasons = []string{
	ReasonUndecodable, ReasonUnknownSchema, ReasonInvalid, ReasonTooOld,
	ReasonInFuture, ReasonOversized, ReasonUnknownMeter, ReasonUninsertable,
	ReasonOverLimit, ReasonNoCredit,
}

// AggregateStatus is OPEN until the period is final, then FINAL once.
type AggregateStatus string

// Aggregate statuses.
const (
	StatusOpen  AggregateStatus = "OPEN"
	StatusFinal AggregateStatus = "FINAL"
)

// Aggregate is one revision of usage for customer × meter × period [×
// group], in usage.aggregates.
type Aggregate struct {
	CustomerID     string          `avro:"customer_id"`
	Meter          string          `avro:"meter"`
	Group          []Property      `avro:"group"`
	Aggregation    string          `avro:"aggregation"`
	PeriodStart    int64           `avro:"period_start"`
	PeriodEnd      int64           `avro:"period_end"`
	Revision       int64           `avro:"revision"`
	Status         AggregateStatus `avro:"status"`
	Value          int64           `avro:"value"`
	EventCount     int64           `avro:"event_count"`
	FirstEventTime int64           `avro:"first_event_time"`
	LastEventTime  int64           `avro:"last_event_time"`
	UpdatedAt      int64           `avro:"updated_at"`
}

// Kind implements Message.
func (*Aggregate) Kind() Kind { return KindAggregate }

// Adjustment books a late event into the period containing its arrival.
type Adjustment struct {
	EventID             string     `avro:"event_id"`
	CustomerID          string     `avro:"customer_id"`
	Meter               string     `avro:"meter"`
	Group               []Property `avro:"group"`
	Aggregation         string     `avro:"aggregation"`
	OriginalPeriodStart int64      `avro:"original_period_start"`
	OriginalPeriodEnd   int64      `avro:"original_period_end"`
	BookedPeriodStart   int64      `avro:"booked_period_start"`
	BookedPeriodEnd     int64      `avro:"booked_period_end"`
	Delta               int64      `avro:"delta"`
	Quantity            int64      `avro:"quantity"`
	EventTime           int64      `avro:"event_time"`
	IngestTime          int64      `avro:"ingest_time"`
}

// Kind implements Message.
func (*Adjustment) Kind() Kind { return KindAdjustment }
