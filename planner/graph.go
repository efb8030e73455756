package planner

// OpKind is the kind of an FX node, as in torch.fx.Node.op.
type OpKind int32

const (
	OpPlaceholder  OpKind = 0
	OpGetAttr      OpKind = 1
	OpCallModule   OpKind = 2
	OpCallFunction OpKind = 3
	OpCallMethod   OpKind = 4
	OpOutput       OpKind = 5
)

// RefKind says how a node refers to a parameter. ModeTorch counts each kind
// the way torch's DDPOptimizer does; ModeDDP treats them alike.
type RefKind uint8

const (
	RefArg    RefKind = 0 // a parameter placeholder passed as a positional argument
	RefOther  RefKind = 1 // any other use: keyword arguments, nested containers
	RefModule RefKind = 2 // owned by the module that a call_module/call_method node calls
	RefAttr   RefKind = 3 // fetched by a get_attr node
)

// Mode selects the bucketing rules.
type Mode int32

const (
	ModeDDP   Mode = 0
	ModeTorch Mode = 1
)

// String is the mode as options and records name it.
func (m Mode) String() string {
	switch m {
	case ModeDDP:
		return "ddp"
	case ModeTorch:
		return "torch"
	}
	return "unknown"
}

// Param is one entry of the parameter table.
type Param struct {
	Name         string // fully qualified name
	Bytes        int64  // numel * element size
	StorageBytes int64  // untyped_storage().nbytes()
	DType        int32  // opaque code: equal codes mean equal dtypes
	Device       int32  // opaque code
	RequiresGrad bool
	Ignored      bool // excluded from DDP (_ddp_ignored)
	// DDPPosition is the parameter's index in DDP's own parameter list
	// (declaration order), -1 if DDP does not reduce it. Read only under
	// Config.BucketOrder == OrderDeclaration.
	DDPPosition int32
}

// Graph is a forward FX graph in flat form. Nodes are in topological order.
// Per-node lists are CSR: node i's entries are Values[Offsets[i]:Offsets[i+1]].
type Graph struct {
	Ops       []OpKind
	ModuleIDs []int32 // module identity for call_module/call_method nodes, -1 otherwise

	ParamOffsets []int64
	ParamIndex   []int32   // indices into Params
	ParamRefs    []RefKind // parallel to ParamIndex

	UserOffsets []int64
	Users       []int32 // each user index is greater than its node's

	Params []Param

	// BlockIDs (optional, ModeDDP) names, per node, the instance of a
	// repeated module block (a transformer layer, say) that the node
	// belongs to, or -1. nil means no block information. With at least two
	// block runs, ModeDDP cuts at block boundaries (see blocks.go).
	BlockIDs []int32

	// NodeFlops and NodeBytes (optional, both or neither) estimate what
	// each node costs to run (Note [Edge costs]): the flops of the library
	// kernels it calls, and the bytes it reads and writes unfused. nil:
	// no estimate.
	NodeFlops []int64
	NodeBytes []int64
}

// Config holds the bucket caps and the mode.
type Config struct {
	Mode                Mode
	BucketCapBytes      int64   // > 0
	FirstBucketCapBytes int64   // > 0, <= BucketCapBytes
	BucketCapsBytes     []int64 // optional per-bucket caps in DDP order; the last repeats (ModeDDP)
	MaxPieces           int     // 0: no limit; otherwise merge adjacent pieces down to this many (ModeDDP)

	// AlignBuckets (ModeDDP) replaces the bucket list, once the cuts are
	// final, by one bucket per piece with the exact byte total of the
	// parameters first used in it, meant to be handed to DDP as per-bucket
	// caps. With several (DType, Device) keys: split by key (Note [Several
	// dtype groups]; under OrderDeclaration, Note [Declaration order per
	// group]).
	AlignBuckets bool

	// BucketOrder (ModeDDP) says whether DDP rebuilds its buckets in
	// gradient-ready order (OrderReady) or keeps declaration-order ones
	// (OrderDeclaration, see declorder.go); with AlignBuckets it decides
	// which caps align them.
	BucketOrder BucketOrder
}
