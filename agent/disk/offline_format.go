package disk

import "github.com/latchkey/latchkey/agent/disk/luks2"

// The offline token's format lives with the rest of the LUKS2 format in
// luks2 (offline_token.go); these names keep the stage's API whole.

// OfflineTokenType is the LUKS2 token type of the offline token.
const OfflineTokenType = luks2.OfflineTokenType

// OfflineToken is the offline token's content (luks2.OfflineToken).
type OfflineToken = luks2.OfflineToken

// EncodeGrant and DecodeGrant are the token's grant encoding.
var (
	EncodeGrant = luks2.EncodeGrant
	DecodeGrant = luks2.DecodeGrant
)
