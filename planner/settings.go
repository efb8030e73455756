package planner

// This file turns what the caller knows (the user's options and the DDP
// module's own settings) into the Config that Build plans with: the one
// place that fills in cap defaults and decides DDP's bucket order.
//
// Note [Cap defaults]: the caps follow the DDP module unless the user
// overrides them, and otherwise DDP's own rules:
//   - bucket cap: the user's, else DDP's bucket_bytes_cap, else DDP's
//     default 25 MiB;
//   - first-bucket cap: the user's; else in ModeTorch 1 MiB (torch's
//     DDPOptimizer; it asserts when that exceeds the cap, goddp clamps);
//     else in ModeDDP DDP's first-bucket cap when the module keeps one,
//     else DDP's rule (1 MiB with the default cap, else the cap itself);
//     never above the bucket cap;
//   - per-bucket caps: the user's; else DDP's, in ModeDDP and only while
//     the user leaves the bucket cap alone (an overridden cap replaces the
//     whole cap list, as it does in DDP).
// A cap the user did not give, or DDP does not keep, is CapNotGiven, here
// and in the C ABI alike (the shim's None).

const (
	// DefaultBucketCapBytes is DDP's default bucket_cap_mb (25 MiB).
	DefaultBucketCapBytes = 25 << 20
	// DefaultFirstBucketCapBytes is torch.distributed's
	// _DEFAULT_FIRST_BUCKET_BYTES (1 MiB).
	DefaultFirstBucketCapBytes = 1 << 20
	// CapNotGiven is a cap the user did not give, or that DDP does not keep
	// (Note [Cap defaults]); a given cap is > 0.
	CapNotGiven = 0
)

// DDPSettings are a DistributedDataParallel module's own bucket settings
// and flags, as read from the module.
type DDPSettings struct {
	BucketCapBytes int64 // bucket_bytes_cap, > 0
	// CapIsDefault: the module was built with the default bucket_cap_mb.
	CapIsDefault bool
	// FirstBucketCapBytes is the module's first-bucket cap, > 0, or
	// CapNotGiven when this torch keeps none (DDP's rule from the cap then
	// applies).
	FirstBucketCapBytes  int64
	BucketCapsBytes      []int64 // its per-bucket caps (torch >= 2.9), DDP order; may be empty
	FindUnusedParameters bool
	StaticGraph          bool
	// Facts that refuse alignment (Note [Alignment refusals]).
	NoPerBucketCaps bool // this torch's DDP keeps no per-bucket caps
	PythonReducer   bool // DDP runs its Python reducer
	MixedPrecision  bool // DDP mixed precision is on
	BuiltinCommHook bool // a built-in (C++) comm hook the caller cannot identify is registered
	// NumParams is the number of parameters DDP reduces, 0 when unknown.
	// With it (and Graph's DDPPosition for every parameter), Decide checks
	// that aligned buckets hold exactly DDP's parameters.
	NumParams int
}

// Settings are the inputs of one planning request besides the graph: the
// user's choices and, inside a DDP forward, the DDP module's settings.
type Settings struct {
	Mode Mode
	// The user's caps, CapNotGiven where not given (a given cap must be > 0).
	UserBucketCapBytes      int64
	UserFirstBucketCapBytes int64
	UserBucketCapsBytes     []int64 // the user's per-bucket caps, DDP order; empty: none
	MaxPieces               int
	// AlignBuckets asks for DDP's buckets to be set to the pieces; Decide
	// says whether they can be (Decision.AlignReason).
	AlignBuckets bool
	// BucketOrder, when no DDP module is given, is the caller's explicit
	// choice; with a DDP module Decide derives it from the module's flags
	// and BucketOrder must be OrderReady.
	BucketOrder BucketOrder
	// BlockCuts (ModeDDP) derives Graph.BlockIDs from Request.Stacks.
	BlockCuts bool
	Edges     EdgePolicy
	DDP       *DDPSettings // nil outside a DDP module
	// UniformCaps (ModeDDP) gives every bucket the resolved bucket cap: the
	// first-bucket cap and per-bucket caps are not applied
	// (Note [Uniform caps] in planner/regions.go).
	UniformCaps bool
}

// checkSettings rejects settings that no resolution can make sense of, in
// the settings' own terms, before any default is filled in.
func checkSettings(s *Settings) error {
	if s.UserBucketCapBytes < 0 {
		return errorf(ErrInvalidConfig, "planner: the user's bucket cap is %d bytes; it must be > 0", s.UserBucketCapBytes)
	}
	if s.UserFirstBucketCapBytes < 0 {
		return errorf(ErrInvalidConfig, "planner: the user's first-bucket cap is %d bytes; it must be > 0", s.UserFirstBucketCapBytes)
	}
	switch s.Edges {
	case EdgesCompile, EdgesAuto, EdgesEager:
	default:
		return errorf(ErrInvalidConfig, "planner: unknown edge policy %d (valid: %d = compile, %d = auto, %d = eager)",
			s.Edges, EdgesCompile, EdgesAuto, EdgesEager)
	}
	if s.UniformCaps && s.Mode == ModeTorch {
		return errorf(ErrInvalidConfig, "planner: UniformCaps is not supported in ModeTorch, whose first bucket is torch's DDPOptimizer's; use ModeDDP")
	}
	if s.BlockCuts && s.Mode == ModeTorch {
		return errorf(ErrInvalidConfig, "planner: BlockCuts is not supported in ModeTorch, which reproduces torch's DDPOptimizer exactly; use ModeDDP")
	}
	d := s.DDP
	if d == nil {
		return nil
	}
	if d.BucketCapBytes <= 0 {
		return errorf(ErrInvalidConfig, "planner: DDP's bucket cap is %d bytes; it must be > 0", d.BucketCapBytes)
	}
	if d.FirstBucketCapBytes < 0 {
		return errorf(ErrInvalidConfig, "planner: DDP's first-bucket cap is %d bytes; it must be > 0, or %d when the module keeps none",
			d.FirstBucketCapBytes, CapNotGiven)
	}
	for i, c := range d.BucketCapsBytes {
		if c <= 0 {
			return errorf(ErrInvalidConfig, "planner: DDP's per-bucket cap %d is %d bytes; it must be > 0", i, c)
		}
	}
	if d.NumParams < 0 {
		return errorf(ErrInvalidConfig, "planner: DDP's parameter count is %d; it must be >= 0 (0: unknown)", d.NumParams)
	}
	if s.BucketOrder != OrderReady {
		return errorf(ErrInvalidConfig, "planner: an explicit bucket order (%d) together with DDP settings; with DDP settings the planner derives the order from the module's flags",
			s.BucketOrder)
	}
	return nil
}

// resolve returns the Config to plan with, aligned or not (Note [Cap
// defaults]). The result still goes through validateConfig in Build.
func (s *Settings) resolve(align bool) Config {
	d := s.DDP
	capBytes := int64(DefaultBucketCapBytes)
	switch {
	case s.UserBucketCapBytes != CapNotGiven:
		capBytes = s.UserBucketCapBytes
	case d != nil:
		capBytes = d.BucketCapBytes
	}
	cfg := Config{
		Mode:                s.Mode,
		BucketCapBytes:      capBytes,
		FirstBucketCapBytes: s.firstCap(capBytes),
		MaxPieces:           s.MaxPieces,
		AlignBuckets:        align,
	}
	switch {
	case len(s.UserBucketCapsBytes) > 0:
		cfg.BucketCapsBytes = s.UserBucketCapsBytes
	case d != nil && s.Mode == ModeDDP && s.UserBucketCapBytes == CapNotGiven && len(d.BucketCapsBytes) > 0:
		cfg.BucketCapsBytes = d.BucketCapsBytes
	}
	cfg.BucketOrder = s.BucketOrder
	if d != nil && align {
		cfg.BucketOrder = d.bucketOrder()
	}
	if s.UniformCaps {
		uniformCaps(&cfg)
	}
	return cfg
}

// firstCap is the first-bucket cap under bucket cap capBytes.
func (s *Settings) firstCap(capBytes int64) int64 {
	if s.UserFirstBucketCapBytes != CapNotGiven {
		return s.UserFirstBucketCapBytes
	}
	if s.Mode == ModeTorch {
		return min(DefaultFirstBucketCapBytes, capBytes)
	}
	var first int64
	switch d := s.DDP; {
	case d != nil && d.FirstBucketCapBytes > 0:
		first = d.FirstBucketCapBytes
	case d != nil:
		first = d.BucketCapBytes
		if d.CapIsDefault {
			first = DefaultFirstBucketCapBytes
		}
		first = min(first, d.BucketCapBytes)
	case s.UserBucketCapBytes == CapNotGiven:
		first = DefaultFirstBucketCapBytes
	default:
		first = capBytes
	}
	return min(first, capBytes)
}

// bucketOrder is the order in which this DDP module fills the buckets it
// reduces with: it never rebuilds them (declaration order) exactly when it
// finds unused parameters without a static graph (declorder.go).
func (d *DDPSettings) bucketOrder() BucketOrder {
	if d.FindUnusedParameters && !d.StaticGraph {
		return OrderDeclaration
	}
	return OrderReady
}
