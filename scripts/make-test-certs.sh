#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Make throwaway TLS material for tests and demos in DIR:
#   ca.pem/ca.key        a CA
#   cert.pem/key.pem     a leaf signed by it: SAN IP:127.0.0.1, IP:::1,
#                        DNS:localhost; serverAuth and clientAuth
#   other-ca.pem, other-cert.pem/other-key.pem   the same from another CA
#   expired-cert.pem/expired-key.pem             signed by ca, expired
# Keys are RSA 2048; TW_TEST_CERT_KEY=ec makes them ECDSA P-256 (the test
# suites ask for it with TW_TEST_QUICK, for valgrind: a handshake's RSA
# signature is most of its time there, ECDSA's a small part).
# Uses the openssl command line tool only.
set -e
dir=${1:?usage: make-test-certs.sh DIR}
case ${TW_TEST_CERT_KEY:-rsa} in
rsa) newkey="rsa:2048" ;;
ec) newkey="ec -pkeyopt ec_paramgen_curve:P-256" ;;
*) echo "make-test-certs.sh: TW_TEST_CERT_KEY must be rsa or ec" >&2 && exit 2 ;;
esac
mkdir -p "$dir"
cd "$dir"
ext=leaf.ext
cat >"$ext" <<'X'
basicConstraints=CA:FALSE
subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost
extendedKeyUsage=serverAuth,clientAuth
keyUsage=digitalSignature,keyEncipherment
X
ca() { # name
	openssl req -x509 -newkey $newkey -nodes -days 2 -subj "/CN=taskwire test $1" \
		-keyout "$1.key" -out "$1.pem" 2>/dev/null
}
leaf() { # ca name days-or-dates...
	c=$1; n=$2; shift 2
	openssl req -newkey $newkey -nodes -subj "/CN=localhost" -keyout "$n-key.pem" \
		-out "$n.csr" 2>/dev/null
	openssl x509 -req -in "$n.csr" -CA "$c.pem" -CAkey "$c.key" -CAcreateserial \
		-extfile "$ext" -out "$n-cert.pem" "$@" 2>/dev/null
	rm -f "$n.csr"
}
ca ca
ca other-ca
leaf ca leaf -days 2
mv leaf-cert.pem cert.pem
mv leaf-key.pem key.pem
leaf other-ca other -days 2
# An already expired certificate: backdated with openssl ca's -startdate.
openssl req -newkey $newkey -nodes -subj "/CN=localhost" -keyout expired-key.pem \
	-out expired.csr 2>/dev/null
mkdir -p ca.db && : >ca.db/index && echo 01 >ca.db/serial
cat >ca.cnf <<X
[ca]
default_ca = test
[test]
database = ca.db/index
serial = ca.db/serial
new_certs_dir = ca.db
default_md = sha256
policy = any
unique_subject = no
[any]
commonName = supplied
X
openssl ca -batch -config ca.cnf -cert ca.pem -keyfile ca.key -in expired.csr \
	-out expired-cert.pem -extfile "$ext" -startdate 20200101000000Z \
	-enddate 20200102000000Z -notext 2>/dev/null
rm -rf expired.csr ca.db ca.cnf "$ext" ./*.srl
