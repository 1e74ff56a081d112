package token

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	kubeadmconstants "k8s.io/kubernetes/cmd/kubeadm/app/constants"
	cryptoutil "k8s.io/kubernetes/cmd/kubeadm/app/util/crypto"

	"github.com/latchkey/latchkey/internal/kubekey"
)

// maxCertFile bounds each certificate or key file latchkey uploads.
const maxCertFile = 64 << 10

// sharedCerts are the files `kubeadm init phase upload-certs` shares with
// joining control-plane nodes (stacked etcd), relative to the PKI dir.
var sharedCerts = []string{
	kubeadmconstants.CACertName, kubeadmconstants.CAKeyName,
	kubeadmconstants.FrontProxyCACertName, kubeadmconstants.FrontProxyCAKeyName,
	kubeadmconstants.ServiceAccountPublicKeyName, kubeadmconstants.ServiceAccountPrivateKeyName,
	kubeadmconstants.EtcdCACertName, kubeadmconstants.EtcdCAKeyName,
}

// uploadCerts encrypts the shared control-plane certificates with a fresh
// kubeadm certificate key (32 random bytes, written as hex, as kubeadm's
// copycerts.CreateCertificateKey makes it, and kubeadm's own AES-GCM
// helper, so `kubeadm join --control-plane` decrypts them with its
// download-certs phase) and stores them in the kubeadm-certs Secret,
// owned by the token Secret so the garbage collector removes them with
// the token. It returns the hex key.
//
// There is one kubeadm-certs Secret per cluster: a later control-plane
// mint replaces an earlier one's copy, and that earlier joiner's
// download-certs fails and is retried with a fresh ticket.
func uploadCerts(ctx context.Context, c kubernetes.Interface, dir string, owner *corev1.Secret) (string, error) {
	// Not copycerts.CreateCertificateKey: importing that package links
	// client-go's fake clientsets into the verifier.
	raw := make([]byte, kubeadmconstants.CertificateKeySize)
	defer clear(raw)
	if _, err := rand.Read(raw); err != nil {
		return "", fmt.Errorf("create certificate key: %w", err)
	}
	data, err := encryptCerts(dir, raw)
	if err != nil {
		return "", err
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:            kubeadmconstants.KubeadmCertsSecret,
			Namespace:       metav1.NamespaceSystem,
			Labels:          map[string]string{kubekey.LabelManagedBy: kubekey.ManagedBy},
			OwnerReferences: []metav1.OwnerReference{ownerRef(owner)},
		},
		Data: data,
	}
	if err := createOrReplace(ctx, c, s); err != nil {
		return "", fmt.Errorf("store %s: %w", kubeadmconstants.KubeadmCertsSecret, err)
	}
	return hex.EncodeToString(raw), nil
}

// encryptCerts reads and encrypts each shared file; a missing file is
// stored empty, as kubeadm does.
func encryptCerts(dir string, key []byte) (map[string][]byte, error) {
	data := map[string][]byte{}
	for _, name := range sharedCerts {
		plain, err := readLimited(filepath.Join(dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			data[secretKeyName(name)] = nil
			continue
		}
		if err != nil {
			return nil, err
		}
		enc, err := cryptoutil.EncryptBytes(plain, key)
		clear(plain)
		if err != nil {
			return nil, fmt.Errorf("encrypt %s: %w", name, err)
		}
		data[secretKeyName(name)] = enc
	}
	return data, nil
}

func readLimited(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.Size() > maxCertFile {
		return nil, fmt.Errorf("%s is %d bytes, over the %d byte limit", path, fi.Size(), maxCertFile)
	}
	return os.ReadFile(path)
}

// secretKeyName maps "etcd/ca.crt" to "etcd-ca.crt" as kubeadm does.
func secretKeyName(name string) string { return strings.ReplaceAll(name, "/", "-") }

func ownerRef(s *corev1.Secret) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: "v1", Kind: "Secret", Name: s.Name, UID: s.UID}
}

// createOrReplace creates s, or replaces the existing object's data,
// labels and owners.
func createOrReplace(ctx context.Context, c kubernetes.Interface, s *corev1.Secret) error {
	secrets := c.CoreV1().Secrets(s.Namespace)
	_, err := secrets.Create(ctx, s, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	cur, err := secrets.Get(ctx, s.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	cur.Data, cur.Labels, cur.OwnerReferences = s.Data, s.Labels, s.OwnerReferences
	_, err = secrets.Update(ctx, cur, metav1.UpdateOptions{})
	return err
}

// deleteOwnedCerts deletes kubeadm-certs when the token Secret named
// owner owns it, so a revoked control-plane token takes its certificates
// with it at once instead of when the garbage collector gets to them.
func deleteOwnedCerts(ctx context.Context, c kubernetes.Interface, owner string) error {
	secrets := c.CoreV1().Secrets(metav1.NamespaceSystem)
	cur, err := secrets.Get(ctx, kubeadmconstants.KubeadmCertsSecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if !ownedBy(cur, owner) {
		return nil
	}
	uid := cur.UID
	err = secrets.Delete(ctx, cur.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

func ownedBy(s *corev1.Secret, owner string) bool {
	for _, r := range s.OwnerReferences {
		if r.Kind == "Secret" && r.Name == owner {
			return true
		}
	}
	return false
}
