// Package containers is OpenAI's containers on top of the sandbox backends: "cntr_" ids recorded
// in the store, one sandbox each, and their whole life. Manager creates them (under the caller's
// quotas), opens them again by id (reviving one whose sandbox outlived its process), leases them to
// the requests that hold them and keeps their sandboxes alive, expires idle ones and reaps them,
// deletes them, and shuts down with the process. It also keeps the container files (what is
// placed into /mnt/data and what code writes there), serves the Containers API's side (list,
// retrieve, delete), and sweeps orphaned sandboxes that no record names.
//
// It imports the backend contract (internal/sandbox) and the state (internal/store), never a
// backend: backends are chosen by the configuration and reached through sandbox.Registry.
package containers
