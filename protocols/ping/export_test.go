package ping

// TypeRequest is a discovery request's type, for tests that forge one.
const TypeRequest = typeRequest
