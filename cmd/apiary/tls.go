package main

// apiary tls ca create / tls cert create: the CA and the certificates of
// Apiary's mutual TLS, as `nomad tls` makes Nomad's (internal/pki does the
// work). Every failure exits 2 and names the flag or the file.

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"apiary.dev/apiary/internal/pki"
)

func init() { register(newTLSCmd) }

// File names of `apiary tls ca create`, the defaults of cert create's --ca
// and --ca-key.
const (
	caCertFile = "apiary-ca.pem"
	caKeyFile  = "apiary-ca-key.pem"
)

func newTLSCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tls",
		Short: "Create the CA and the certificates of Apiary's mutual TLS",
		Long: `Create a certificate authority and the certificates that coordinators,
routers, agents and clients present to each other (as "nomad tls" does).

  apiary tls ca create
  apiary tls cert create --role region --region eu-west --id eu-west-1
  apiary tls cert create --role router --id global-1
  apiary tls cert create --role agent --region eu-west --id n1
  apiary tls cert create --role client

A certificate carries its identity in a URI SAN spiffe://apiary/<region>/<role>/<id>
and the DNS names <role>.<region>.apiary and <id>.<role>.<region>.apiary.`,
	}
	ca := &cobra.Command{Use: "ca", Short: "Create the certificate authority"}
	ca.AddCommand(newTLSCACreateCmd())
	cert := &cobra.Command{Use: "cert", Short: "Create certificates signed by the CA"}
	cert.AddCommand(newTLSCertCreateCmd())
	cmd.AddCommand(ca, cert)
	return cmd
}

func newTLSCACreateCmd() *cobra.Command {
	var (
		dir  string
		days int
	)
	cmd := &cobra.Command{
		Use:   "create [--dir D] [--days N]",
		Short: "Create a self-signed ECDSA CA: apiary-ca.pem and apiary-ca-key.pem",
		Long: `Create a self-signed ECDSA P-256 certificate authority, CommonName
"Apiary CA <random>", valid --days days (default 5 years), and write it to
--dir as apiary-ca.pem (the certificate: give it to every process as --tls-ca)
and apiary-ca-key.pem (its private key, mode 0600: it signs every certificate;
keep it off the hosts that run Apiary).

Existing files are never overwritten: the command exits 2 naming the file.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if days <= 0 {
				return withCode(exitInvalid, fmt.Errorf("--days: must be > 0 (got %d)", days))
			}
			certPath, keyPath := filepath.Join(dir, caCertFile), filepath.Join(dir, caKeyFile)
			if err := refuseExisting(certPath, keyPath); err != nil {
				return err
			}
			certPEM, keyPEM, err := pki.CreateCA(pki.CAOptions{Days: days})
			if err != nil {
				return withCode(exitInvalid, err)
			}
			if err := writePair(dir, certPath, certPEM, keyPath, keyPEM); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "==> CA certificate saved to: %s\n", certPath)
			fmt.Fprintf(out, "==> CA key saved to: %s (mode 0600; it signs every certificate, keep it safe)\n", keyPath)
			if c, err := firstCert(certPEM); err == nil {
				fmt.Fprintf(out, "==> CA %q valid until %s\n", c.Subject.CommonName, c.NotAfter.UTC().Format(time.RFC3339))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", ".", "directory to write the files to (made, mode 0700, if missing)")
	f.IntVar(&days, "days", pki.DefaultCADays, "validity in days")
	return cmd
}

func newTLSCertCreateCmd() *cobra.Command {
	var (
		opts           pki.CertOptions
		dir, ca, caKey string
		days           int
	)
	cmd := &cobra.Command{
		Use:   "create --role region|router|agent|client [--region R] [--id ID] [--dns NAME]... [--ip IP]...",
		Short: "Create a certificate for a coordinator, router, agent or client",
		Long: `Create an ECDSA P-256 certificate signed by the CA and write it to --dir as
<region>-<role>-<id>.pem and <region>-<role>-<id>-key.pem (mode 0600).

--role    region (a coordinator), router (a global router), agent (a node
          agent) or client (the CLI or an API user).
--region  the region: required for region and agent; router certificates are
          for region "global"; a client certificate is "global" unless given.
--id      region: the coordinator's --id; agent: its --node-id; router: its
          --name; client: free (default "cli"). 1-63 of a-z, 0-9 and '-'.

The certificate carries the identity spiffe://apiary/<region>/<role>/<id> (a
URI SAN) and the DNS names <role>.<region>.apiary and <id>.<role>.<region>.apiary;
region and router certificates also localhost, 127.0.0.1 and ::1 (they serve),
and are valid for server and client authentication; agent and client
certificates for client authentication only. Add the names and addresses
peers dial with --dns and --ip.

Existing files are never overwritten: the command exits 2 naming the file.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if days <= 0 {
				return withCode(exitInvalid, fmt.Errorf("--days: must be > 0 (got %d)", days))
			}
			opts.Days = days
			id, err := opts.Identity()
			if err != nil {
				return withCode(exitInvalid, err)
			}
			base := fmt.Sprintf("%s-%s-%s", id.Region, id.Role, id.ID)
			certPath, keyPath := filepath.Join(dir, base+".pem"), filepath.Join(dir, base+"-key.pem")
			if err := refuseExisting(certPath, keyPath); err != nil {
				return err
			}
			if ca == "" {
				ca = filepath.Join(dir, caCertFile)
			}
			if caKey == "" {
				caKey = filepath.Join(dir, caKeyFile)
			}
			caPEM, err := os.ReadFile(ca)
			if err != nil {
				return withCode(exitInvalid, fmt.Errorf("--ca: %w (make a CA with `apiary tls ca create`)", err))
			}
			caKeyPEM, err := os.ReadFile(caKey)
			if err != nil {
				return withCode(exitInvalid, fmt.Errorf("--ca-key: %w", err))
			}
			certPEM, keyPEM, err := pki.CreateCert(caPEM, caKeyPEM, opts)
			if err != nil {
				if strings.HasPrefix(err.Error(), "--ca") {
					err = fmt.Errorf("%w (--ca %s, --ca-key %s)", err, ca, caKey)
				}
				return withCode(exitInvalid, err)
			}
			if err := writePair(dir, certPath, certPEM, keyPath, keyPEM); err != nil {
				return err
			}
			printCert(cmd.OutOrStdout(), ca, caPEM, certPath, keyPath, certPEM)
			if id.Role == pki.RoleRegion || id.Role == pki.RoleRouter {
				fmt.Fprintf(cmd.ErrOrStderr(), "WARNING: a %s certificate grants the authority of a %s (%s): serving the API and "+
					"calling other servers as one. Install it only on that host and store its key as securely as the CA key.\n",
					id.Role, map[string]string{pki.RoleRegion: "coordinator of region " + id.Region, pki.RoleRouter: "global router"}[id.Role], id)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Role, "role", "", "region, router, agent or client (required)")
	f.StringVar(&opts.Region, "region", "", `region name (required for region and agent; "global" for router and, by default, client)`)
	f.StringVar(&opts.ID, "id", "", `coordinator id, node id or router name (required for those; client default "cli")`)
	f.StringArrayVar(&opts.DNSNames, "dns", nil, "additional DNS name (repeatable)")
	f.StringArrayVar(&opts.IPs, "ip", nil, "additional IP address (repeatable)")
	f.IntVar(&days, "days", pki.DefaultCertDays, "validity in days")
	f.StringVar(&ca, "ca", "", "CA certificate (default <--dir>/"+caCertFile+")")
	f.StringVar(&caKey, "ca-key", "", "CA private key (default <--dir>/"+caKeyFile+")")
	f.StringVar(&dir, "dir", ".", "directory to write the files to (made, mode 0700, if missing)")
	return cmd
}

// refuseExisting fails (exit 2) naming the first of paths that exists.
func refuseExisting(paths ...string) error {
	for _, p := range paths {
		if _, err := os.Lstat(p); err == nil {
			return withCode(exitInvalid, fmt.Errorf("%s exists; refusing to overwrite it (remove it or choose another --dir)", p))
		} else if !errors.Is(err, fs.ErrNotExist) {
			return withCode(exitInvalid, fmt.Errorf("%s: %w", p, err))
		}
	}
	return nil
}

// writePair makes dir if missing and writes the key (mode 0600) then the
// certificate (0644), each only if absent; on failure it removes what it
// wrote.
func writePair(dir, certPath string, certPEM []byte, keyPath string, keyPEM []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return withCode(exitInvalid, fmt.Errorf("--dir: %w", err))
	}
	if err := writeNew(keyPath, keyPEM, 0o600); err != nil {
		return err
	}
	if err := writeNew(certPath, certPEM, 0o644); err != nil {
		os.Remove(keyPath)
		return err
	}
	return nil
}

// writeNew creates path with data and mode, refusing (exit 2) if it exists.
func writeNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if errors.Is(err, fs.ErrExist) {
		return withCode(exitInvalid, fmt.Errorf("%s exists; refusing to overwrite it (remove it or choose another --dir)", path))
	}
	if err != nil {
		return withCode(exitInvalid, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return withCode(exitInvalid, fmt.Errorf("writing %s: %w", path, err))
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return withCode(exitInvalid, fmt.Errorf("writing %s: %w", path, err))
	}
	return nil
}

func firstCert(data []byte) (*x509.Certificate, error) {
	b, _ := pem.Decode(data)
	if b == nil {
		return nil, errors.New("no PEM block")
	}
	return x509.ParseCertificate(b.Bytes)
}

// printCert says what cert create wrote and what the certificate says.
func printCert(w io.Writer, caPath string, caPEM []byte, certPath, keyPath string, certPEM []byte) {
	if c, err := firstCert(caPEM); err == nil {
		fmt.Fprintf(w, "==> Using CA %s (%s)\n", caPath, c.Subject.CommonName)
	}
	fmt.Fprintf(w, "==> Certificate saved to: %s\n", certPath)
	fmt.Fprintf(w, "==> Key saved to: %s (mode 0600)\n", keyPath)
	c, err := firstCert(certPEM)
	if err != nil {
		return
	}
	if id, err := pki.IdentityOf(c); err == nil {
		fmt.Fprintf(w, "==> Identity: %s (role %s, region %s, id %s)\n", id, id.Role, id.Region, id.ID)
	}
	var ips []string
	for _, ip := range c.IPAddresses {
		ips = append(ips, ip.String())
	}
	usage := "client"
	for _, u := range c.ExtKeyUsage {
		if u == x509.ExtKeyUsageServerAuth {
			usage = "server and client"
		}
	}
	fmt.Fprintf(w, "==> DNS names: %s\n", strings.Join(c.DNSNames, ", "))
	if len(ips) > 0 {
		fmt.Fprintf(w, "==> IP addresses: %s\n", strings.Join(ips, ", "))
	}
	fmt.Fprintf(w, "==> Valid for %s authentication until %s\n", usage, c.NotAfter.UTC().Format(time.RFC3339))
}
