package tdx

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/google/go-tdx-guest/pcs"
	pb "github.com/google/go-tdx-guest/proto/tdx"
)

// checkQE runs check 6.
func checkQE(q *pb.QuoteV4, id *pcs.EnclaveIdentity, st *State) error {
	r := q.GetSignedData().GetCertificationData().GetQeReportCertificationData().GetQeReport()
	if len(id.MiscselectMask.Bytes) != 4 || len(id.Miscselect.Bytes) != 4 {
		return untrusted("QE identity MISCSELECT is not 4 bytes")
	}
	mask := binary.LittleEndian.Uint32(id.MiscselectMask.Bytes)
	if r.GetMiscSelect()&mask != binary.LittleEndian.Uint32(id.Miscselect.Bytes) {
		return untrusted("QE MISCSELECT %#x does not match Intel's TD QE identity", r.GetMiscSelect())
	}
	if len(id.AttributesMask.Bytes) != len(r.GetAttributes()) || !bytes.Equal(mask16(id.AttributesMask.Bytes, r.GetAttributes()), id.Attributes.Bytes) {
		return untrusted("QE ATTRIBUTES %s do not match Intel's TD QE identity", hex.EncodeToString(r.GetAttributes()))
	}
	if !bytes.Equal(r.GetMrSigner(), id.Mrsigner.Bytes) {
		return untrusted("QE MRSIGNER %s is not Intel's TD QE signer", hex.EncodeToString(r.GetMrSigner()))
	}
	if r.GetIsvProdId() != uint32(id.IsvProdID) {
		return untrusted("QE ISVPRODID %d is not the TD QE's %d", r.GetIsvProdId(), id.IsvProdID)
	}
	st.QESVN = r.GetIsvSvn()
	for _, l := range id.TcbLevels {
		if l.Tcb.Isvsvn <= r.GetIsvSvn() {
			st.QETCBStatus = l.TcbStatus
			return nil
		}
	}
	st.QETCBStatus = NoTCBLevel
	return nil
}

func mask16(mask, v []byte) []byte {
	out := make([]byte, len(v))
	for i := range v {
		out[i] = mask[i] & v[i]
	}
	return out
}

// checkModule runs check 7.
func checkModule(q *pb.QuoteV4, pck *pckInfo, info *pcs.TcbInfo, st *State) error {
	b := q.GetTdQuoteBody()
	if !strings.EqualFold(info.PceID, pck.ext.PCEID) {
		return untrusted("PCEID %s of the PCK certificate is not the TCB info's %s", pck.ext.PCEID, info.PceID)
	}
	if !bytes.Equal(b.GetMrSignerSeam(), info.TdxModule.Mrsigner.Bytes) {
		return untrusted("MRSIGNERSEAM %s is not the TDX module signer of the TCB info", hex.EncodeToString(b.GetMrSignerSeam()))
	}
	if len(info.TdxModule.AttributesMask.Bytes) != len(b.GetSeamAttributes()) ||
		!bytes.Equal(mask16(info.TdxModule.AttributesMask.Bytes, b.GetSeamAttributes()), info.TdxModule.Attributes.Bytes) {
		return untrusted("SEAM attributes %s do not match the TCB info's TDX module", hex.EncodeToString(b.GetSeamAttributes()))
	}
	svn := b.GetTeeTcbSvn()
	st.PlatformTCBStatus = NoTCBLevel
	if lvl := matchLevel(info.TcbLevels, svn, pck.ext.TCB.PCESvn, pck.ext.TCB.CPUSvnComponents); lvl != nil {
		st.PlatformTCBStatus, st.TCBDate, st.AdvisoryIDs = lvl.TcbStatus, lvl.TcbDate, slices.Clone(lvl.AdvisoryIDs)
	}
	if svn[1] > 0 {
		st.ModuleTCBStatus = moduleStatus(info.TdxModuleIdentities, svn)
	}
	return nil
}

// matchLevel is Intel's TCB level selection: the first level (they are
// sorted newest first) whose SGX components and PCESVN the PCK
// certificate meets and whose TDX components TEE_TCB_SVN meets; the TDX
// components 0 and 1 (module SVN and major version) are skipped for a
// module with a major version, which moduleStatus judges instead.
func matchLevel(levels []pcs.TcbLevel, teeTcbSvn []byte, pceSvn uint16, cpuSvn []byte) *pcs.TcbLevel {
	for i := range levels {
		l := &levels[i]
		if svnAtLeast(cpuSvn, l.Tcb.SgxTcbcomponents, 0) && pceSvn >= l.Tcb.Pcesvn &&
			svnAtLeast(teeTcbSvn, l.Tcb.TdxTcbcomponents, tdxStart(teeTcbSvn)) {
			return l
		}
	}
	return nil
}

func tdxStart(teeTcbSvn []byte) int {
	if teeTcbSvn[1] > 0 {
		return 2
	}
	return 0
}

func svnAtLeast(have []byte, want []pcs.TcbComponent, from int) bool {
	if len(have) != len(want) {
		return false
	}
	for i := from; i < len(have); i++ {
		if have[i] < want[i].Svn {
			return false
		}
	}
	return true
}

// moduleStatus is the TCB status of the TDX module identity
// "TDX_<major version>" for the module's SVN; NoTCBLevel when the TCB
// info lists no such identity or level.
func moduleStatus(ids []pcs.TdxModuleIdentity, teeTcbSvn []byte) pcs.TcbComponentStatus {
	want := fmt.Sprintf("TDX_%02x", teeTcbSvn[1])
	for _, id := range ids {
		if !strings.EqualFold(id.ID, want) {
			continue
		}
		for _, l := range id.TcbLevels {
			if uint32(teeTcbSvn[0]) >= l.Tcb.Isvsvn {
				return l.TcbStatus
			}
		}
	}
	return NoTCBLevel
}
