;;; opencortex-connection.el --- The one connection to the kernel  -*- lexical-binding: t; -*-

;; This file is part of opencortex.
;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; One `opencortex--connection' per Emacs, and its whole lifecycle: finding
;; the kernel already running for the home (through its connection file),
;; or else starting the kernel process (the secret goes in its environment,
;; never in argv) and reading the port from its first line of output,
;; connecting over EPC, authenticating, sending calls (always asynchronous:
;; `epc:call-deferred'), noticing the kernel died (restart a kernel Emacs
;; started once automatically, then ask; offer to reconnect to one it did
;; not start), and stopping it cleanly.  Only one kernel runs per home.
;; The methods the kernel calls into Emacs are in opencortex-chat.el,
;; opencortex-stream.el, opencortex-approval.el, opencortex-tools.el and
;; opencortex-tools-org.el.

;;; Code:

(require 'cl-lib)
(require 'epc)
(require 'json)
(require 'subr-x)
(require 'opencortex-chat)
(require 'opencortex-stream)
(require 'opencortex-approval)
(require 'opencortex-tools)
(require 'opencortex-tools-org)

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

(defcustom opencortex-start-timeout 30
  "Seconds the kernel may take to print its port."
  :type 'number
  :group 'opencortex)

(defcustom opencortex-stop-timeout 2
  "Seconds the kernel gets to exit after SIGTERM before it is killed."
  :type 'number
  :group 'opencortex)

(defcustom opencortex-auto-restart-limit 1
  "How often a kernel that died is restarted without asking."
  :type 'integer
  :group 'opencortex)

;;;; The connection

(cl-defstruct (opencortex--connection (:constructor opencortex--make-connection)
                                      (:copier nil))
  "The one connection to a kernel.
MANAGER is the `epc:manager', PROCESS the kernel we started (nil when
connected through a connection file: such a kernel is not Emacs's to
stop or restart), SECRET what `authenticate' is given, STATE one of
`starting', `authenticating', `ready', `dead', `stopped', `failed'.
HOME is the kernel's home (nil when unknown), FILE the connection file
Emacs found the kernel through.  PENDING maps call ids to (ON-SUCCESS
. ON-ERROR) for calls sent and not answered; WAITING holds calls made
before the kernel was ready, newest first."
  manager process secret state command (output "") stderr timer
  home file (pending (make-hash-table)) waiting)

(defvar opencortex--connection nil
  "The current `opencortex--connection', or nil.")

(defvar opencortex--auto-restarts 0
  "How often the kernel was restarted without asking since the last manual start.")

(defvar opencortex--restart-timer nil
  "Timer that will restart a kernel that died, or nil.")

(defvar opencortex--call-id 0
  "Id of the latest call sent to the kernel.")

(defconst opencortex--methods
  '((opencortex-insert opencortex--handle-insert "(BUFFER TEXT)"
                       "Insert TEXT at the end of BUFFER.")
    (opencortex-stream opencortex--handle-stream "(TURN-ID KIND TEXT)"
                       "Streamed reply text: KIND is chunk, end or abort.")
    (opencortex-ask-approval opencortex--handle-ask-approval "(APPROVAL-ID DETAILS)"
                             "Ask the person to approve what DETAILS describes.")
    (opencortex-show-error opencortex--handle-show-error "(TEXT)"
                           "Show TEXT as an error in the chat buffer.")
    (opencortex-status-changed opencortex--handle-status-changed "(STATUS)"
                               "Show the new STATUS in the header line."))
  "The methods Emacs offers the kernel: (NAME FUNCTION ARGS DOC).")

(defun opencortex--live-p (conn)
  "Whether CONN is starting, authenticating or ready."
  (and conn (memq (opencortex--connection-state conn) '(starting authenticating ready))))

(defun opencortex--set-state (conn state)
  "Put CONN in STATE and show it in the header line."
  (setf (opencortex--connection-state conn) state)
  (when (eq conn opencortex--connection)
    (setq opencortex--kernel-state state)
    (opencortex--update-header)))

(defun opencortex--fresh-secret ()
  "A new random secret: 64 hex digits (32 bytes)."
  (secure-hash 'sha256 (format "%s%s%s" (random t) (current-time) (emacs-pid))))

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

(defun opencortex--stderr-tail (conn)
  "The last lines the kernel of CONN wrote to stderr (logs, never messages)."
  (let ((buffer (opencortex--connection-stderr conn)))
    (when (buffer-live-p buffer)
      (with-current-buffer buffer
        (let ((text (string-trim (buffer-substring-no-properties
                                  (max (point-min) (- (point-max) 600)) (point-max)))))
          (unless (string-empty-p text) text))))))

;;;; Starting and connecting

(defun opencortex--begin (conn)
  "Make CONN the connection, in state `starting'."
  (setq opencortex--connection conn)
  (opencortex--set-state conn 'starting)
  (add-hook 'kill-emacs-hook #'opencortex--stop-on-exit))

(defun opencortex--connect-kernel (kernel)
  "Connect to the running KERNEL, a plist from `opencortex--read-connection-file'.
Emacs did not start that kernel: it never stops or restarts it.
Return the new connection."
  (let ((conn (opencortex--make-connection :secret (plist-get kernel :secret)
                                           :home (plist-get kernel :home)
                                           :file (plist-get kernel :file))))
    (opencortex--begin conn)
    (opencortex--attach conn (plist-get kernel :port))
    conn))

(defun opencortex--connect-or-start ()
  "Connect to the kernel running for `opencortex-home', or else start one.
Return the new connection."
  (let ((kernel (opencortex--running-kernel)))
    (if kernel
        (opencortex--connect-kernel kernel)
      (opencortex--start-kernel))))

(defun opencortex--start-kernel ()
  "Start a kernel process; it connects once it prints its port.
Return the new connection (in state `failed' when the process could not start)."
  (let* ((secret (opencortex--fresh-secret))
         (command (opencortex--kernel-command))
         (conn (opencortex--make-connection :secret secret :command command
                                            :home (opencortex--kernel-home)))
         (stderr (generate-new-buffer " *opencortex-kernel-stderr*"))
         (process-environment (cons (concat "OPENCORTEX_SECRET=" secret) process-environment))
         (default-directory (opencortex--kernel-directory)))
    (setf (opencortex--connection-stderr conn) stderr)
    (opencortex--begin conn)
    (condition-case err
        (let ((process (make-process
                        :name "opencortex-kernel" :buffer nil :command command
                        :connection-type 'pipe :noquery t :stderr stderr
                        :coding 'utf-8-unix
                        :filter (lambda (_ output) (opencortex--kernel-output conn output))
                        :sentinel (lambda (process _)
                                    (unless (process-live-p process)
                                      (opencortex--lost conn (opencortex--exit-text process)))))))
          (setf (opencortex--connection-process conn) process)
          (let ((stderr-process (get-buffer-process stderr)))
            (when stderr-process
              (set-process-query-on-exit-flag stderr-process nil)
              (set-process-sentinel stderr-process #'ignore)))
          (setf (opencortex--connection-timer conn)
                (run-at-time opencortex-start-timeout nil #'opencortex--lost conn
                             (format "it printed no port within %s s" opencortex-start-timeout))))
      (error (opencortex--lost conn (error-message-string err))))
    conn))

(defun opencortex--exit-text (process)
  "How PROCESS ended, in words."
  (pcase (process-status process)
    ('exit (format "it exited with code %d" (process-exit-status process)))
    ('signal (format "it was killed by signal %d" (process-exit-status process)))
    (status (format "its status is %s" status))))

(defun opencortex--kernel-output (conn output)
  "Read the port from the first line of OUTPUT of CONN's kernel; ignore the rest."
  (when (eq (opencortex--connection-state conn) 'starting)
    (let ((text (concat (opencortex--connection-output conn) output)))
      (setf (opencortex--connection-output conn) text)
      (when (string-match "\n" text)
        (let ((line (string-trim (substring text 0 (match-beginning 0)))))
          (if (string-match-p "\\`[0-9]+\\'" line)
              (opencortex--attach conn (string-to-number line))
            (opencortex--lost conn (format "it printed %S instead of its port"
                                           (truncate-string-to-width line 80)))))))))

(defun opencortex--attach (conn port)
  "Connect CONN to the kernel on 127.0.0.1:PORT over EPC and authenticate.
The kernel prints its port before it has loaded its skills; it answers
once it has, and within `opencortex-start-timeout' seconds or not at all."
  (when (timerp (opencortex--connection-timer conn))
    (cancel-timer (opencortex--connection-timer conn)))
  (setf (opencortex--connection-timer conn)
        (run-at-time opencortex-start-timeout nil #'opencortex--lost conn
                     (format "it did not answer within %s s" opencortex-start-timeout)))
  (condition-case err
      (let* ((epc-connection (epc:connect "127.0.0.1" port))
             (manager (make-epc:manager
                       :server-process (opencortex--connection-process conn)
                       :commands (opencortex--connection-command conn)
                       :title "opencortex" :port port :connection epc-connection))
             (network (epc:connection-process epc-connection))
             (epc-sentinel (process-sentinel network)))
        (set-process-sentinel network
                              (lambda (process event)
                                (funcall epc-sentinel process event)
                                (opencortex--connection-closed conn)))
        (epc:init-epc-layer manager)
        (dolist (method (append opencortex--methods opencortex--tool-methods))
          (epc:define-method manager (nth 0 method) (nth 1 method) (nth 2 method) (nth 3 method)))
        (setf (opencortex--connection-manager conn) manager)
        (opencortex--set-state conn 'authenticating)
        (opencortex--dispatch
         conn 'authenticate (list (opencortex--connection-secret conn))
         (lambda (answer)
           (if (eq answer t)
               (opencortex--ready conn)
             (opencortex--lost conn "it did not accept the secret")))
         (lambda (message)
           (opencortex--lost conn (format "authentication failed (%s)" message)))))
    (error (opencortex--lost conn (format "could not connect to port %s: %s"
                                          port (error-message-string err))))))

(defun opencortex--connection-closed (conn)
  "The EPC connection of CONN closed: report how its kernel ended.
A kernel we started usually exits at the same moment: its exit status is
the better news, so wait a little for it before speaking."
  (let ((process (opencortex--connection-process conn)))
    (cond ((null process) (opencortex--lost conn "the connection closed"))
          ((not (process-live-p process))
           (opencortex--lost conn (opencortex--exit-text process)))
          (t (run-at-time 0.5 nil #'opencortex--lost conn "it closed the connection")))))

(defun opencortex--ready (conn)
  "Mark CONN ready, then send what waited for it to authenticate."
  (when (timerp (opencortex--connection-timer conn))
    (cancel-timer (opencortex--connection-timer conn)))
  (opencortex--set-state conn 'ready)
  (let ((waiting (reverse (opencortex--connection-waiting conn))))
    (setf (opencortex--connection-waiting conn) nil)
    (dolist (call waiting)
      (apply #'opencortex--dispatch conn call)))
  (opencortex--refresh-status))

;;;; Calls

(defun opencortex--error-text (error)
  "ERROR from epc or deferred as a message string."
  (cond ((and (stringp error) (string-prefix-p "\"" error))
         (let ((value (ignore-errors (car (read-from-string error)))))
           (if (stringp value) value error)))
        ((stringp error) error)
        ((eq (car-safe error) 'epc-error) (format "%s" (cadr error)))
        ((and (consp error) (get (car error) 'error-conditions))
         (error-message-string error))
        (t (format "%S" error))))

(defun opencortex--dispatch (conn method args on-success on-error)
  "Send METHOD with ARGS over CONN; call ON-SUCCESS or ON-ERROR with the outcome."
  (let ((id (cl-incf opencortex--call-id))
        (pending (opencortex--connection-pending conn))
        (on-error (or on-error (lambda (message) (opencortex--call-failed method message)))))
    (puthash id (cons on-success on-error) pending)
    (condition-case err
        (let ((deferred (epc:call-deferred (opencortex--connection-manager conn) method args)))
          (deferred:error
            (deferred:nextc deferred
              (lambda (value)
                (when (gethash id pending)
                  (remhash id pending)
                  (when on-success
                    (condition-case failure
                        (funcall on-success value)
                      (error (opencortex--show-error
                              (format "opencortex could not show the answer to %s: %s"
                                      method (error-message-string failure)))))))))
            (lambda (failure)
              (when (gethash id pending)
                (remhash id pending)
                (funcall on-error (opencortex--error-text failure))))))
      (error (remhash id pending)
             (funcall on-error (error-message-string err))))))

(defun opencortex--call-failed (method message)
  "Show that the kernel answered METHOD with an error MESSAGE."
  (opencortex--show-error (format "The kernel could not do %s: %s" method message)))

(defconst opencortex--methods-needing-a-kernel '(abort-turn answer-approval)
  "Calls that make no sense for a new kernel: they never start one.")

(defun opencortex--call (method args &optional on-success on-error)
  "Call METHOD with ARGS in the kernel, asynchronously.
ON-SUCCESS gets the result, ON-ERROR a message (default: shown in the chat
buffer).  Without a connection, Emacs connects to the kernel running for
`opencortex-home' or else starts one, except for the methods in
`opencortex--methods-needing-a-kernel'."
  (let ((conn opencortex--connection))
    (unless (or (opencortex--live-p conn)
                (memq method opencortex--methods-needing-a-kernel))
      (setq conn (opencortex--connect-or-start)))
    (pcase (and conn (opencortex--connection-state conn))
      ('ready (opencortex--dispatch conn method args on-success on-error))
      ((or 'starting 'authenticating)
       (push (list method args on-success on-error) (opencortex--connection-waiting conn)))
      (_ (funcall (or on-error (lambda (message) (opencortex--call-failed method message)))
                  "the kernel is not running (M-x opencortex-chat starts it)")))))

;;;; Death, stopping, restarting

(defun opencortex--release (conn)
  "Close what CONN has open: timer, EPC connection, processes, buffers."
  (when (timerp (opencortex--connection-timer conn))
    (cancel-timer (opencortex--connection-timer conn)))
  (let ((manager (opencortex--connection-manager conn)))
    (when manager
      (ignore-errors (epc:disconnect (epc:manager-connection manager)))
      (epc:live-connections-delete manager)))
  (let ((process (opencortex--connection-process conn)))
    (when (processp process)
      (set-process-sentinel process #'ignore)
      (delete-process process)))
  (let ((stderr (opencortex--connection-stderr conn)))
    (when (buffer-live-p stderr)
      (let ((process (get-buffer-process stderr)))
        (when process (delete-process process)))
      (kill-buffer stderr))))

(defun opencortex--fail-waiting (conn message)
  "Report MESSAGE, the failure of CONN, to each call waiting on it."
  (let ((waiting (reverse (opencortex--connection-waiting conn))))
    (setf (opencortex--connection-waiting conn) nil)
    (clrhash (opencortex--connection-pending conn))
    (dolist (call waiting)
      (let ((on-error (nth 3 call)))
        (when on-error (funcall on-error message))))))

(defconst opencortex--already-running-regexp "a kernel is already running for"
  "What a kernel prints on stderr when another kernel holds its home.")

(defun opencortex--refused-for-another-p (conn state stderr)
  "Return non-nil if CONN, in STATE, is a start refused for another kernel.
STDERR is the end of what the refused kernel printed.  The start is
retried as a connection only once: a start Emacs made, not a connection."
  (let ((process (opencortex--connection-process conn)))
    (and (eq state 'starting) (processp process) (not (process-live-p process))
         (or (and stderr (string-match-p opencortex--already-running-regexp stderr))
             (ignore-errors (opencortex--running-kernel (opencortex--connection-home conn)))))))

(defun opencortex--join-running (conn refusal)
  "Connect CONN to the kernel running for its home, which refused CONN's own.
REFUSAL is what the refused kernel said.  The running kernel may not
have written its connection file yet: look for it every 0.1 s, for at
most `opencortex-start-timeout' seconds; then give up."
  (let ((stderr (opencortex--connection-stderr conn))
        (deadline (+ (float-time) opencortex-start-timeout)))
    (when (timerp (opencortex--connection-timer conn))
      (cancel-timer (opencortex--connection-timer conn)))
    (set-process-sentinel (opencortex--connection-process conn) #'ignore)
    (delete-process (opencortex--connection-process conn))
    (when (buffer-live-p stderr)
      (let ((process (get-buffer-process stderr)))
        (when process (delete-process process)))
      (kill-buffer stderr))
    ;; From now on this connection is to a kernel Emacs did not start.
    (setf (opencortex--connection-process conn) nil
          (opencortex--connection-command conn) nil
          (opencortex--connection-stderr conn) nil
          (opencortex--connection-file conn)
          (opencortex--home-connection-file (opencortex--connection-home conn)))
    (setf (opencortex--connection-timer conn)
          (run-at-time 0 0.1 #'opencortex--try-join conn refusal deadline))))

(defun opencortex--try-join (conn refusal deadline)
  "Connect CONN to the kernel running for its home once its file names it.
Give up after DEADLINE (a `float-time'); REFUSAL is why Emacs's own
start failed."
  (if (not (eq (opencortex--connection-state conn) 'starting))
      (cancel-timer (opencortex--connection-timer conn))
    (let ((kernel (condition-case err
                      (opencortex--running-kernel (opencortex--connection-home conn))
                    (user-error (error-message-string err)))))
      (cond ((consp kernel)
             (setf (opencortex--connection-secret conn) (plist-get kernel :secret))
             (opencortex--attach conn (plist-get kernel :port)))
            ((or (stringp kernel) (> (float-time) deadline))
             (cancel-timer (opencortex--connection-timer conn))
             (opencortex--lost
              conn (format "%s; %s" (string-trim refusal)
                           (or kernel (format "but its connection file %s named no running kernel within %s s"
                                              (opencortex--connection-file conn)
                                              opencortex-start-timeout)))))))))

(defun opencortex--lost (conn why)
  "CONN's kernel is gone or unusable because of WHY: say so, maybe restart.
A start refused because a kernel already runs for the home becomes a
connection to that kernel instead."
  (let ((state (opencortex--connection-state conn)))
    (when (and (eq conn opencortex--connection)
               (memq state '(starting authenticating ready)))
      (let ((stderr (opencortex--stderr-tail conn))
            (started (opencortex--connection-process conn)))
        (if (opencortex--refused-for-another-p conn state stderr)
            (opencortex--join-running conn (or stderr why))
          (opencortex--set-state conn (if (eq state 'ready) 'dead 'failed))
          (opencortex--release conn)
          (opencortex--fail-waiting conn "the kernel is not running")
          (let ((turns (opencortex--abandon-turns)))
            (opencortex--abandon-approvals)
            (opencortex--show-error
             (concat (cond ((eq state 'ready)
                            (format "The opencortex kernel stopped: %s." why))
                           (started (format "The opencortex kernel could not start: %s." why))
                           (t (format "Emacs could not connect to the opencortex kernel%s: %s."
                                      (opencortex--home-words conn) why)))
                     (if (> turns 0) " The reply in progress was lost and removed." "")
                     (if stderr (format "\nIts last log lines:\n%s" stderr) "")
                     "\n"
                     (opencortex--after-loss state conn)))))))))

(defun opencortex--home-words (conn)
  "\" for HOME\" for the home of CONN's kernel, or \"\" when it is unknown."
  (let ((home (opencortex--connection-home conn)))
    (if home (format " for %s" home) "")))

(defun opencortex--after-loss (state conn)
  "Decide what follows the loss of CONN's kernel, then in STATE; say it in words.
A kernel that was ready and that Emacs started is restarted from a
timer: without asking `opencortex-auto-restart-limit' times, then after
`y-or-n-p'.  A kernel Emacs did not start is not Emacs's to restart:
Emacs offers to connect again (interactive sessions only) and never
starts a kernel of its own in its place."
  (let ((started (opencortex--connection-process conn))
        (command (opencortex--connection-command conn)))
    (cond
     ((and (not (eq state 'ready)) command)
      (format "The command was %S.  If that is not the opencortex you installed, set `opencortex-program' to it; `opencortex doctor' in a shell says what is missing.  Then M-x opencortex-restart."
              command))
     ((not (eq state 'ready))
      (format "Check that the kernel runs and that %s is its connection file, then M-x opencortex-chat (it connects to the kernel running for the home, and starts one only when none runs)."
              (or (opencortex--connection-file conn) "the file Emacs read")))
     ((not started)
      (unless noninteractive (opencortex--schedule-reconnect conn))
      (format "Emacs did not start that kernel%s, so it neither stops nor restarts it.  M-x opencortex-chat connects again once it runs%s."
              (opencortex--home-words conn)
              (if noninteractive "" "; Emacs asks whether to now")))
     ((< opencortex--auto-restarts opencortex-auto-restart-limit)
      (cl-incf opencortex--auto-restarts)
      (opencortex--schedule-restart nil)
      "Restarting it now; send your message again once it is back.")
     (noninteractive "Restart it with M-x opencortex-restart.")
     (t (opencortex--schedule-restart t)
        "It died again, so Emacs asks before restarting it (M-x opencortex-restart any time)."))))

(defun opencortex--schedule-reconnect (conn)
  "Offer, from a timer, to connect again to the kernel CONN was connected to."
  (opencortex--when-still-lost
   (format "The opencortex kernel%s went away.  Connect again? "
           (opencortex--home-words conn))
   (lambda () (opencortex--reconnect conn))))

(defun opencortex--reconnect (conn)
  "Connect to the kernel running where CONN's kernel ran: its home, or its file.
Only a connection: when no kernel runs there, say so and start none."
  (let* ((home (opencortex--connection-home conn))
         (file (opencortex--connection-file conn))
         (kernel (or (and home (opencortex--running-kernel home))
                     (and file (file-exists-p file)
                          (let ((named (opencortex--read-connection-file file)))
                            (and (opencortex--kernel-pid-live-p (plist-get named :pid))
                                 named))))))
    (if kernel
        (opencortex--connect-kernel kernel)
      (message "opencortex: no kernel runs%s now; M-x opencortex-chat starts one"
               (opencortex--home-words conn)))))

(defun opencortex--schedule-restart (ask)
  "Restart the kernel from a timer; with ASK only after `y-or-n-p'."
  (opencortex--when-still-lost
   (and ask "The opencortex kernel died again.  Restart it? ")
   #'opencortex--connect-or-start))

(defun opencortex--when-still-lost (question action)
  "From a timer, call ACTION unless a live connection is back by then.
When QUESTION is a string, ACTION runs only if the person says yes to it."
  (setq opencortex--restart-timer
        (run-at-time 0 nil
                     (lambda ()
                       (setq opencortex--restart-timer nil)
                       (unless (or (opencortex--live-p opencortex--connection)
                                   (and question (not (y-or-n-p question))))
                         (funcall action))))))

(defun opencortex--shutdown (conn)
  "Stop CONN cleanly: SIGTERM to our kernel, a bounded wait, then `epc:stop-epc'."
  (let ((process (opencortex--connection-process conn))
        (manager (opencortex--connection-manager conn)))
    (opencortex--set-state conn 'stopped)
    (when (process-live-p process)
      (set-process-sentinel process #'ignore)
      (signal-process process 'SIGTERM)
      (let ((deadline (+ (float-time) opencortex-stop-timeout)))
        (while (and (process-live-p process) (< (float-time) deadline))
          (accept-process-output process 0.05))))
    (when manager
      (ignore-errors (epc:stop-epc manager)))
    (opencortex--release conn)
    (opencortex--fail-waiting conn "the kernel was stopped")
    (opencortex--abandon-turns)
    (opencortex--abandon-approvals)))

(defun opencortex--stop-on-exit ()
  "Stop the kernel when Emacs exits (on `kill-emacs-hook').
Only a SIGTERM, no waiting: Emacs may be exiting because its terminal is
gone, and waiting for process output then never ends.  The kernel shuts
down cleanly on SIGTERM by itself."
  (when (timerp opencortex--restart-timer)
    (cancel-timer opencortex--restart-timer))
  (let* ((conn opencortex--connection)
         (process (and conn (opencortex--connection-process conn))))
    (when conn
      (ignore-errors (opencortex--set-state conn 'stopped)))
    (when (and process (process-live-p process))
      (set-process-sentinel process #'ignore)
      (ignore-errors (signal-process process 'SIGTERM)))))

(provide 'opencortex-connection)
;;; opencortex-connection.el ends here
