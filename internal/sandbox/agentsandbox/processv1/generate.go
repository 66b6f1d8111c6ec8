// Package processv1 is the generated Go code of sandboxd's process service (process.proto, a copy
// of its wire schema): the client the agent-sandbox backend calls and the server its test double
// implements.
package processv1

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative process.proto
