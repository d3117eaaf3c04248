#!/bin/sh
# Runs every fuzz target for a while each (default 3s, as CI does; longer:
# scripts/fuzz.sh 10m, or make fuzz FUZZTIME=10m). Their seed corpora run
# with the ordinary tests anyway. A failure leaves the input under the
# package's testdata/fuzz, which then runs with the ordinary tests: commit
# it with the fix.
set -eu
time=${1:-3s}
go=${GO:-go}
for target in \
	./lbctl:FuzzReadDocuments \
	./server/resourcefile:FuzzParse \
	./server/resourcewire:FuzzConvertAndValidate \
	./server/agentsync:FuzzReport \
	./internal/nodewire:FuzzDecode; do
	pkg=${target%%:*}
	name=${target#*:}
	echo "fuzz: $name ($pkg) for $time"
	$go test -run '^$' -fuzz "^$name\$" -fuzztime "$time" "$pkg"
done
