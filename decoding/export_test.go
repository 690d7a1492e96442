package decoding

// StateForTest returns d's protocol state, for tests that compare it before and after a call.
func (d *Decoder) StateForTest() any { return d.st }

// SetStateForTest puts d inside a transaction (Begin…Commit, or Begin Prepare…Prepare if
// prepare) with xid txnXid when inTxn, and inside a stream block of blockXid when inBlock.
func (d *Decoder) SetStateForTest(inTxn, prepare bool, txnXid uint32, inBlock bool, blockXid uint32) {
	d.st = state{inTxn: inTxn, txnPrepare: prepare, txnXid: txnXid, inBlock: inBlock, blockXid: blockXid}
}
