package stack

// Protocol ids. Each protocol type has one fixed id; it is the key of the
// protocol's header on the wire, so ids never change once released. This is
// the one table of them (JGroups' jg-protocol-ids.xml). Ids 1..511 are
// strata's own, 512..1023 are reserved for companion projects, and 1024 and
// above are free for users' protocols.
const (
	IDSIM           uint16 = 1
	IDUDP           uint16 = 2
	IDPING          uint16 = 3
	IDStaticPING    uint16 = 4
	IDMERGE3        uint16 = 5
	IDFDALL         uint16 = 6
	IDVerifySuspect uint16 = 7
	IDNAKACK        uint16 = 8
	IDUNICAST2      uint16 = 9
	IDSTABLE        uint16 = 10
	IDGMS           uint16 = 11
	IDFRAG          uint16 = 12
	IDStateTransfer uint16 = 13
	IDFLUSH         uint16 = 14
	IDGROUPFC       uint16 = 15
	IDDISCARD       uint16 = 16
	IDDELAY         uint16 = 17
	IDCOMPRESS      uint16 = 18
	IDENCRYPT       uint16 = 19
	IDAUTH          uint16 = 20
	IDUFC           uint16 = 21
	IDMFC           uint16 = 22
	IDRPC           uint16 = 23 // package rpc's request/response header (not a layer)
	IDTCP           uint16 = 24
	IDDNSPing       uint16 = 25

	// IDUserMin is the first id free for protocols outside strata.
	IDUserMin uint16 = 1024
)
