// Package entitlements holds the model and the per-event decision of
// docs/entitlements.md: free-tier caps and credit balances, decided exactly
// once in the aggregator's transaction. It knows nothing of Kafka or
// Pebble: the aggregator feeds it the records of usage.entitlements and the
// events of usage.deduped, keeps what it returns in its state and emits
// what it decides. Everything here is deterministic: the same records and
// events give the same decisions, whenever and however often they are
// replayed.
//
// # Which entitlements decide an event
//
// Every record of usage.entitlements has a broker timestamp (its arrival)
// and an effective_from, raised to that timestamp when earlier (a broker
// timestamp behind what the partition has been read up to, a clock that
// stepped back, counts as that read-to time). Records are read in
// partition order. An event is decided by the entitlements in
// effect at its own arrival (its ingest_time): for the customer, the most
// recently read record of its key whose effective_from is at or before the
// arrival; if there is none, or that record is a tombstone, the default
// plan, chosen by the same rule among the records under DefaultPlanKey; if
// there is none either, no plan (no caps, no grants, overdraft allowed).
// A record therefore replaces every version of its key that would have
// taken effect at or after its own effective_from (Timeline), and a record
// read after an event arrived never changes that event's decision.
//
// # Which rate prices an event
//
// The rate card (schemas.RateCard, under RateCardKey) is written whole.
// An event is priced by the card as it stood at the earlier of its arrival
// and its event_time (the last card whose broker timestamp is at or before
// that instant), at that card's version in effect at the event_time
// (RateHistory). A late event is thus priced by the rules of its own
// period, and no card can reprice time before it was written.
//
// # The decision (Decide)
//
// In order: an unmetered customer's event is counted and never capped or
// charged. A cap (SUM and COUNT meters only, summed across groups, per
// billing period of the event's own event_time) rejects an event that
// would take the period's usage past the limit, whole (over_limit); an
// event landing exactly on the limit is accepted. Then credits: the cost
// is the event's units times the rate, rounded half up, in micro-credits;
// it is drawn from the grants whose [effective_from, expires_at) holds the
// event_time, by priority (lower first), then earliest expiry, then id;
// what they cannot pay is overdrawn if the overdraft policy allows it,
// else the event is rejected (no_credit). A rejected event consumes
// nothing. A sum that would pass 64 bits rejects the event as invalid.
//
// # State
//
// Ledger keeps, per customer, a Timeline of entitlements and an Account
// (usage per meter and period, what each grant generation paid, overdraft
// per period), plus the default plan's Timeline (and the current
// generation of each of its grants) and the RateHistory. Each is
// serializable (MarshalBinary / Unmarshal*) so that the aggregator can
// keep it in its changelogged state, and bounded: Prune drops what no
// future event can need.
package entitlements
