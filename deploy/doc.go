// Package deploy holds no code: it is the home of the deployment files
// (the Grafana dashboard and its provisioning, the Prometheus scrape
// configs, the ClickHouse settings of docker-compose.yml, and deploy/local's
// scripts for real services in tests) and of the tests that keep them true
// to the code:
//
//   - the compose test (go test -short) parses docker-compose.yml, the
//     Dockerfile and the Prometheus and Grafana files, and runs every
//     meterline command line and METERLINE_* environment they give through
//     the real flag parser;
//   - the dashboard test (make test) runs Debian's prometheus against a real
//     `meterline run` and evaluates every PromQL expression of the dashboard.
package deploy
