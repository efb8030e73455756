package planner

// This file implements Config.AlignBuckets: once the cuts are final, the
// predicted buckets are replaced by one bucket per piece whose bytes are the
// exact total of the counted parameters first used in that piece.
//
// Why this aligns DDP's own buckets with the pieces: DDP rebuilds its buckets
// from the order in which gradients became ready, closing a bucket as soon as
// its bytes reach the current per-bucket cap. All gradients of one piece
// become ready during that piece's backward, in an order the autograd engine
// chooses, but the cumulative byte count at every piece boundary is the same
// whatever that order. With the aligned buckets' bytes as caps (in DDP order,
// bucket 0 = last piece), DDP's rebuild therefore closes bucket k exactly
// when the last gradient of piece N-1-k arrives. That needs a single cap
// iterator, hence a single (dtype, device) key (several are split by key
// afterwards: Note [Several dtype groups], keys.go), and parameters of
// positive size: a zero-byte gradient that arrives after its piece's byte total was
// reached falls into the next DDP bucket (harmless for overlap, since it is
// ready already, but the bucket lists differ).

// alignedBuckets returns one bucket per piece, in DDP order (the last piece
// first). ready is the predicted gradient-ready order of the counted
// parameters in use (reverse forward order of first uses), so the parameters
// of each piece form one contiguous run of it, pieces descending. A bucket's
// Extended says whether any predicted bucket completed by its piece was
// Extended. A piece without counted parameters gets no bucket; in ModeDDP
// that happens only when the graph is a single piece (every piece of a
// multi-piece plan holds a counted parameter).
func alignedBuckets(g *Graph, ready, firstUse, part []int32, numPieces int, predicted []Bucket) []Bucket {
	if len(ready) == 0 {
		return nil
	}
	extended := make([]bool, numPieces)
	for k := range predicted {
		if predicted[k].Extended {
			extended[predicted[k].Piece] = true
		}
	}
	var out []Bucket
	for lo := 0; lo < len(ready); {
		piece := part[firstUse[ready[lo]]]
		hi := lo
		for hi < len(ready) && part[firstUse[ready[hi]]] == piece {
			hi++
		}
		b := bucketFromRun(g, firstUse, ready[lo:hi])
		b.Piece, b.Extended = int(piece), extended[piece]
		out = append(out, b)
		lo = hi
	}
	return out
}

// align replaces the predicted buckets by one bucket per piece, made for
// the order in which DDP fills the buckets it reduces with
// (Config.BucketOrder), and records the caps that give DDP exactly those
// buckets. Under OrderDeclaration it may merge pieces (declorder.go).
func (w *ddpWalk) align(pl *Plan, cuts []int) {
	if w.cfg.BucketOrder == OrderDeclaration && pl.NumPieces > 0 {
		declarationAlign(w.g, w.firstUse, pl, cuts)
		return
	}
	pl.Buckets = alignedBuckets(w.g, w.ready, w.firstUse, pl.NodePiece, pl.NumPieces, pl.Buckets)
	pl.Alignment = AlignReady
	for k := range pl.Buckets {
		pl.DDPCaps = append(pl.DDPCaps, pl.Buckets[k].Bytes)
	}
}
