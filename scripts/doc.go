// Package scripts holds the project's scripts (services, release) and, behind the build tag release,
// the release build's reproducibility test (make test-release).
package scripts
