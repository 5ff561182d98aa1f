// Package rules loads, validates and matches Sluice's rule files: the YAML
// files of envoyproxy/ratelimit, accepted unchanged, plus Sluice's
// extensions in the same files.
//
// # Files
//
// Load reads a directory: every regular file (or symlink to one) named
// *.yaml or *.yml whose name does not start with a dot, in name order.
// Subdirectories are not read (so Kubernetes ConfigMap mounts work). Each
// file holds one domain; two files of one domain are an error. A file is
// at most MaxFileBytes, holds one YAML document, nests descriptors at most
// MaxDepth deep and holds at most MaxDescriptorsPerDomain descriptors.
//
//	domain: edge                       # required, unique across files
//	descriptors:
//	  - key: remote_address            # key only: one counter per value
//	    rate_limit: {unit: second, requests_per_unit: 10}
//	  - key: api_key
//	    value: premium*                # wildcard: a trailing * matches a prefix
//	    rate_limit: {unit: minute, requests_per_unit: 1000}
//	  - key: tenant
//	    value: acme
//	    descriptors:                   # nested: matches 2-entry descriptors
//	      - key: user
//	        rate_limit: {unit: minute, requests_per_unit: 5, name: acme_user}
//
// The keys of envoyproxy/ratelimit mean what they mean there: domain, key,
// value, descriptors, rate_limit {unit, requests_per_unit, unlimited,
// name, replaces [{name}]}, shadow_mode, detailed_metric, value_to_metric,
// share_threshold and quota_mode. Units are second, minute, hour, day,
// week, month and year (in any case); as in envoyproxy/ratelimit they are
// fixed windows aligned to the Unix epoch, a week being 7 days, a month 30
// and a year 365. quota_mode is carried in Spec.QuotaMode, for the
// service to act on. detailed_metric and value_to_metric make the
// service's metrics of a limit per descriptor value (Spec.PerValueMetric),
// named as envoyproxy/ratelimit names its stats (Spec.AppendMetricKey).
//
// No key is read and ignored: `metadata`, which envoyproxy/ratelimit
// copies into its responses' dynamic metadata, is refused at every level
// with its file and line, since Sluice does not return it.
//
// Envoy's runtime layout (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config) is the
// directory to Load; LoadDir can also read dot files (what
// RUNTIME_IGNOREDOTFILES=false asks), and a Watcher given WatchOptions.Root
// follows the swap of RUNTIME_ROOT's symlink.
//
// # Extensions
//
// A rate_limit block may also hold:
//
//	algorithm     gcra | fixed_window | sliding_log | sliding_window | leaky_bucket
//	burst         capacity of gcra and leaky_bucket (default requests_per_unit)
//	period        a Go duration (90s, 1h30m), instead of unit
//	calendar      true: fixed windows on calendar units (real months, days
//	              through DST) of unit, in
//	timezone      an IANA zone (default UTC)
//	failure_mode  local | fail_open | fail_closed; unstated, the store's
//	              default (ratelimit.FailDefault: serve's
//	              --failure-default, local unless set)
//	counting      strict (default) | batched | approximate: where the
//	              counter lives on a shared store (redisstore's package
//	              doc); batched takes gcra, fixed_window and
//	              leaky_bucket, approximate gcra and leaky_bucket
//	cost_unit     what the limit counts: a name of a-z, 0-9 and _, at
//	              most MaxCostUnitBytes (requests, input_tokens, ru);
//	              unstated, the limit counts the request's cost, as in
//	              envoyproxy/ratelimit. (unit is the window's time unit,
//	              as there; cost_unit is what requests_per_unit counts.)
//
// and a descriptor may carry several limits, each with its own counter,
// with a `limits:` list in place of rate_limit:
//
//	descriptors:
//	  - key: user
//	    limits:
//	      - {requests_per_unit: 10, unit: second, burst: 20}
//	      - {requests_per_unit: 1000, unit: day, calendar: true, timezone: Europe/Paris}
//
// Each limit of one descriptor needs its own window, among the limits of
// its cost unit: a descriptor may limit requests, input tokens and output
// tokens per minute at once, each with its own counter, and a request
// decided against them gives a cost per unit (the service's
// Descriptor.Costs):
//
//	descriptors:
//	  - key: model
//	    limits:
//	      - {requests_per_unit: 60, unit: minute}
//	      - {requests_per_unit: 100000, unit: minute, cost_unit: input_tokens}
//	      - {requests_per_unit: 20000, unit: minute, cost_unit: output_tokens}
//
// A limit's generated name ends with its cost unit
// ("llm.model.minute.input_tokens"). Unlimited rules are
// written `rate_limit: {unlimited: true}` only, without any other key but
// name and replaces.
//
// The algorithm of a limit is the one it names. Otherwise it is
// fixed_window for calendar windows; gcra for the extended form, which is
// precisely an entry of a `limits:` list, or a rate_limit block that has a
// `period` or a `burst`; and fixed_window for everything else, so a file of
// envoyproxy/ratelimit counts as it did there (algorithm, calendar,
// timezone, failure_mode and counting alone do not make a limit extended).
//
// # Validation
//
// Parsing is strict and reports every problem of a load, not just the
// first, as *Error values joined with errors.Join, each naming the file,
// the line and the key:
//
//	rules/api.yaml:12: descriptors[1].rate_limit.unit: invalid unit "fortnight" (want second, minute, hour, day, week, month or year)
//
// Unknown keys, metadata, duplicate mapping keys, duplicate domains, duplicate
// descriptors (the same key and value at one level), duplicate rule names
// in a domain, values of the wrong type, empty domains and keys, bad
// units and cost units, unit or other limit keys with unlimited, missing
// or negative requests_per_unit, a burst without a refill rate, replaces
// naming its own rule, an empty replaces entry or a rule that does not
// exist, and share_threshold on a value that is not a wildcard are
// errors. Every
// limit becomes a ratelimit.Rule that passed Rule.Validate. A value may be
// written as a number (value: 30 is "30"), as envoyproxy/ratelimit allows.
// YAML aliases are followed; merge keys (<<) are not supported.
//
// Where Sluice is stricter than envoyproxy/ratelimit: requests_per_unit
// is required (there a missing one means 0), names must be unique and
// replaces must name a rule of the domain; and a wildcard matches the key
// exactly and the value by prefix (there the prefix is taken over
// "key_value", so keys containing "_" could cross-match).
//
// # Matching
//
// Domain.Match finds the limits of one request descriptor exactly as
// envoyproxy/ratelimit does: a descriptor with N entries matches only a
// path N deep; at each level an exact key and value beats the first
// matching wildcard (in file order), which beats the key-only descriptor;
// there is no backtracking, so once a level matched an exact value its
// key-only sibling is not tried for deeper levels. A matched descriptor
// without limits (neither rate_limit nor limits) answers "no limit". An
// unlimited rule matches but is never counted; a shadow_mode rule is
// decided and counted, and its Spec says Shadow so the service answers
// OK. ApplyReplaces then drops the rules that other matched rules replace.
//
// Spec.AppendKey builds the storage key of a matched limit; see its
// documentation for the format and what a rule change keeps.
//
// # Concurrency
//
// A Set and everything it holds are immutable once built: safe for
// concurrent use without locks. Reloading builds a new Set.
package rules
