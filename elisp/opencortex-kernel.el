;;; opencortex-kernel.el --- Where the kernel is: its program, home and connection file  -*- lexical-binding: t; -*-

;; This file is part of opencortex.
;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; What Emacs needs to know before it talks to a kernel: the program and
;; command line it would start the kernel with, the home that kernel would
;; use (resolved as the kernel resolves it), and the connection file of the
;; kernel already running for that home, read only when no one else could
;; have written it.  Only lookups: opencortex-connection.el starts, joins
;; and stops kernels.

;;; Code:

(require 'cl-lib)
(require 'json)
(require 'subr-x)

;;;; Options

(define-obsolete-variable-alias 'opencortex-python-command 'opencortex-program "0.1.0")

(defcustom opencortex-program nil
  "The opencortex program Emacs starts the kernel with.
nil (the default) finds it: first the `opencortex' of the Python
installation these Emacs Lisp files came with (the .venv/bin of the
source checkout whose elisp/ directory holds them, or the bin directory
of the Python whose site-packages holds them), then `opencortex' on
the variable `exec-path', and last \"python3 -m opencortex\".  A string
names the program; a list of strings is a whole command, such as
\(\"python3.12\" \"-m\" \"opencortex\").  The kernel runs as this command
followed by \"serve\" and `opencortex-kernel-arguments'."
  :type '(choice (const :tag "Find it" nil)
                 (file :tag "Program")
                 (repeat :tag "Command" string))
  :group 'opencortex)

(defcustom opencortex-kernel-arguments nil
  "Extra arguments after \"serve\", such as (\"--home\" \"/some/dir\").
\\[opencortex-set-backend] and \\[opencortex-set-model] change the
\"--backend\" and \"--model\" given here."
  :type '(repeat string)
  :group 'opencortex)

(defcustom opencortex-home nil
  "The kernel's home: the directory of its memory, settings and lock.
nil (the default) means what the kernel itself would use: the
\"--home\" in `opencortex-kernel-arguments' when there is one, else
$OPENCORTEX_HOME, else $XDG_DATA_HOME/opencortex, else
~/.local/share/opencortex.  A directory here is given to the kernel
Emacs starts as its \"--home\".  Only one kernel runs per home:
\\[opencortex-chat] connects to the kernel already running for this home
\(found through its connection file) and starts one only when none runs."
  :type '(choice (const :tag "What the kernel would use" nil) directory)
  :group 'opencortex)

;;;; The program and its command line

(defconst opencortex--elisp-directory
  (file-name-directory (file-truename (or load-file-name buffer-file-name default-directory)))
  "The directory these Emacs Lisp files were loaded from (symbolic links followed).")

(defun opencortex--site-packages (directory)
  "The site-packages (or dist-packages) directory holding DIRECTORY, or nil."
  (let ((dir (directory-file-name (expand-file-name directory)))
        found)
    (while (and dir (not found))
      (if (member (file-name-nondirectory dir) '("site-packages" "dist-packages"))
          (setq found dir)
        (let ((parent (directory-file-name (file-name-directory dir))))
          (setq dir (and (not (equal parent dir)) parent)))))
    found))

(defun opencortex--parent (directory levels)
  "The directory LEVELS levels above DIRECTORY."
  (let ((dir (directory-file-name (expand-file-name directory))))
    (dotimes (_ levels)
      (setq dir (directory-file-name (file-name-directory dir))))
    dir))

(defun opencortex--bundled-programs (directory)
  "Where the opencortex program that belongs with the elisp in DIRECTORY would be.
A source checkout keeps the elisp in <checkout>/elisp and its virtual
environment in <checkout>/.venv; an installed wheel keeps the elisp
under <prefix>/lib/pythonX.Y/site-packages and the program in
<prefix>/bin."
  (let ((site (opencortex--site-packages directory)))
    (cons (expand-file-name ".venv/bin/opencortex" (opencortex--parent directory 1))
          (and site (list (expand-file-name "bin/opencortex" (opencortex--parent site 3)))))))

(defun opencortex--find-program (&optional directory)
  "Return the command for the opencortex found for the elisp in DIRECTORY.
DIRECTORY defaults to where these files were loaded from; see the variable
`opencortex-program' for the order of the search."
  (let ((bundled (cl-find-if (lambda (file) (and (file-executable-p file)
                                                 (not (file-directory-p file))))
                             (opencortex--bundled-programs
                              (or directory opencortex--elisp-directory))))
        (on-path (executable-find "opencortex")))
    (cond (bundled (list bundled))
          (on-path (list on-path))
          (t (list "python3" "-m" "opencortex")))))

(defun opencortex--program-command ()
  "Return the command for opencortex that `opencortex-program' names."
  (pcase opencortex-program
    ('nil (opencortex--find-program))
    ((pred stringp) (list opencortex-program))
    ((and (pred consp) (guard (cl-every #'stringp opencortex-program))) opencortex-program)
    (_ (user-error "`opencortex-program' must be nil, a file name or a list of strings"))))

(defun opencortex--with-kernel-option (arguments option value)
  "ARGUMENTS with OPTION set to VALUE, or left out when VALUE is nil.
Both \"OPTION VALUE\" and \"OPTION=VALUE\" forms are replaced."
  (let ((rest arguments) kept)
    (while rest
      (cond ((equal (car rest) option) (setq rest (cddr rest)))
            ((string-prefix-p (concat option "=") (car rest)) (setq rest (cdr rest)))
            (t (push (pop rest) kept))))
    (append (nreverse kept) (and value (list option value)))))

(defun opencortex--kernel-option (option)
  "The value of OPTION in `opencortex-kernel-arguments', or nil."
  (let ((rest opencortex-kernel-arguments) value)
    (while rest
      (cond ((equal (car rest) option) (setq value (cadr rest) rest (cddr rest)))
            ((string-prefix-p (concat option "=") (car rest))
             (setq value (substring (car rest) (1+ (length option))) rest (cdr rest)))
            (t (setq rest (cdr rest)))))
    value))

(defun opencortex--kernel-arguments ()
  "The arguments after \"serve\".
They are `opencortex-kernel-arguments', with `opencortex-home' as the
\"--home\" when it is set."
  (if opencortex-home
      (opencortex--with-kernel-option opencortex-kernel-arguments "--home"
                                      (expand-file-name opencortex-home))
    opencortex-kernel-arguments))

(defun opencortex--kernel-command ()
  "Return the command line to start the kernel with."
  (append (opencortex--program-command) '("serve") (opencortex--kernel-arguments)))

(defun opencortex--kernel-directory ()
  "Return the working directory for the kernel Emacs would start."
  (if (file-remote-p default-directory) "~/" default-directory))

;;;; One kernel per home: its connection file

(defun opencortex--environment (name)
  "The environment variable NAME, or nil when it is unset or empty."
  (let ((value (getenv name)))
    (and value (not (string-empty-p value)) value)))

(defun opencortex--true-directory (directory)
  "DIRECTORY absolute, symbolic links resolved, without a trailing slash.
This is the kernel's Path.resolve(), so the two name a home alike."
  (directory-file-name
   (file-truename (expand-file-name directory (opencortex--kernel-directory)))))

(defun opencortex--kernel-home ()
  "The home of the kernel Emacs would start, resolved as the kernel resolves it.
See `opencortex-home'."
  (opencortex--true-directory
   (or opencortex-home
       (opencortex--kernel-option "--home")
       (opencortex--environment "OPENCORTEX_HOME")
       (expand-file-name "opencortex" (or (opencortex--environment "XDG_DATA_HOME")
                                          "~/.local/share")))))

(defun opencortex--runtime-directory ()
  "Where kernels write their connection files.
$XDG_RUNTIME_DIR/opencortex, or /tmp/opencortex-UID without XDG_RUNTIME_DIR."
  (let ((runtime (opencortex--environment "XDG_RUNTIME_DIR")))
    (if runtime
        (expand-file-name "opencortex" runtime)
      (format "/tmp/opencortex-%d" (user-uid)))))

(defun opencortex--home-connection-file (&optional home)
  "The connection file of the kernel running for HOME.
HOME defaults to the home `opencortex-home' names.  The file is
kernel-H.json in `opencortex--runtime-directory', H being the first 16
hex digits of the SHA-256 of the home's resolved name (UTF-8, no
trailing slash), as the kernel computes it."
  (let ((home (opencortex--true-directory (or home (opencortex--kernel-home)))))
    (expand-file-name
     (format "kernel-%s.json"
             (substring (secure-hash 'sha256 (encode-coding-string home 'utf-8)) 0 16))
     (opencortex--runtime-directory))))

(defun opencortex--read-connection-file (file)
  "The kernel FILE describes, as a plist (:port :secret :pid :home :file).
Only a file of this user that no one else can read is accepted; :pid
and :home are nil when the file does not name them."
  (unless (file-readable-p file)
    (user-error "No kernel connection file %s: start one with `opencortex serve', or use M-x opencortex-chat"
                file))
  (unless (eql (file-attribute-user-id (file-attributes file 'integer)) (user-uid))
    (user-error "The connection file %s belongs to another user; refusing it" file))
  (unless (zerop (logand (file-modes file) #o077))
    (user-error "The connection file %s is readable by others; refusing it (chmod 600)" file))
  (let* ((data (condition-case err
                   (let ((json-object-type 'alist)) (json-read-file file))
                 (error (user-error "The connection file %s is not valid JSON (%s)"
                                    file (error-message-string err)))))
         (port (and (consp data) (alist-get 'port data)))
         (secret (and (consp data) (alist-get 'secret data)))
         (pid (and (consp data) (alist-get 'pid data)))
         (home (and (consp data) (alist-get 'home data))))
    (unless (and (natnump port) (stringp secret))
      (user-error "The connection file %s has no port and secret" file))
    (list :port port :secret secret :pid (and (natnump pid) pid)
          :home (and (stringp home) (not (string-empty-p home)) home) :file file)))

(defun opencortex--check-runtime-directory (directory)
  "Signal a `user-error' unless only this user can change DIRECTORY.
Someone who could would decide which kernel Emacs talks to."
  (let ((attributes (file-attributes (directory-file-name directory) 'integer)))
    (cond ((not (eq (file-attribute-type attributes) t))
           (user-error "%s is not a plain directory (a symbolic link?); refusing the kernel connection files in it"
                       directory))
          ((not (eql (file-attribute-user-id attributes) (user-uid)))
           (user-error "%s belongs to another user; refusing the kernel connection files in it"
                       directory))
          ((not (zerop (logand (file-modes directory) #o022)))
           (user-error "%s is writable by others; refusing the kernel connection files in it (chmod 700 %s)"
                       directory directory)))))

(defun opencortex--kernel-pid-live-p (pid)
  "Whether PID is a running process that may be a kernel (one run with \"serve\")."
  (let ((attributes (and (natnump pid) (> pid 0) (process-attributes pid))))
    (and attributes
         (not (member (alist-get 'state attributes) '("Z" "X" "x")))
         (let ((args (alist-get 'args attributes)))
           (or (not (stringp args))
               (string-match-p "\\(?:\\`\\| \\)serve\\(?: \\|\\'\\)" args))))))

(defun opencortex--running-kernel (&optional home)
  "Return the kernel running for HOME (default: `opencortex-home'), or nil.
The kernel is the plist of `opencortex--read-connection-file' for the
home's connection file, when that file names a live process and this
very home; nil means no kernel runs there.  A file someone else
could have written is refused with a `user-error'."
  (let* ((home (opencortex--true-directory (or home (opencortex--kernel-home))))
         (file (opencortex--home-connection-file home)))
    (when (file-exists-p file)
      (opencortex--check-runtime-directory (file-name-directory file))
      (let ((kernel (opencortex--read-connection-file file)))
        (and (opencortex--kernel-pid-live-p (plist-get kernel :pid))
             (plist-get kernel :home)
             (equal (opencortex--true-directory (plist-get kernel :home)) home)
             kernel)))))

(provide 'opencortex-kernel)
;;; opencortex-kernel.el ends here
