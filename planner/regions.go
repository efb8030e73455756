package planner

// Note [Uniform caps]: the caller plans one activation checkpoint's body
// alone to find where a checkpoint holding more than a bucket's parameters
// may be cut into consecutive checkpoint regions, one per bucket (python/
// goddp/graph/checkpoints.py, Note [Checkpoint bodies]). The body is not
// the whole model: which of its buckets would be DDP's first (the one
// closing last in backward, under the small first-bucket cap) or the k-th
// (DDP's per-bucket caps) depends on what runs around it, and the same
// block checkpointed twice must be cut the same way, so that its regions
// stay identical pieces compiled once. Settings.UniformCaps therefore
// plans with the resolved bucket cap (the user's, else DDP's, else DDP's
// default; Note [Cap defaults]) for every bucket: the first-bucket cap
// becomes the cap and no per-bucket caps apply.

// uniformCaps applies Note [Uniform caps] to a resolved Config.
func uniformCaps(cfg *Config) {
	cfg.FirstBucketCapBytes = cfg.BucketCapBytes
	cfg.BucketCapsBytes = nil
}
