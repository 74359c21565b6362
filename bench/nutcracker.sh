# bench/nutcracker.sh: twemproxy's configuration for every script that
# compares with it (run.sh, syscalls.sh), so they measure the same
# twemproxy. Sourced, not run.
#
# nutcracker_yml LISTEN_PORT REDIS_PORT: prints the configuration. One
# pool, hash and distribution left at their defaults; bench/README.md
# ("What runs") says why server_connections is 1 and ejection is off.
nutcracker_yml() {
	cat <<YML
bench:
  listen: 127.0.0.1:$1
  redis: true
  server_connections: 1
  preconnect: true
  auto_eject_hosts: false
  servers:
    - 127.0.0.1:$2:1
YML
}
