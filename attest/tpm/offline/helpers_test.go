package offline

import (
	"google.golang.org/protobuf/proto"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

func cloneGrant(g *latchkeyv1.OfflineGrant) *latchkeyv1.OfflineGrant {
	return proto.Clone(g).(*latchkeyv1.OfflineGrant)
}
