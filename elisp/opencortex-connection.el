;;; opencortex-connection.el --- The one connection to the kernel  -*- lexical-binding: t; -*-

;; This file is part of opencortex.
;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; One `opencortex--connection' per Emacs, and its whole lifecycle: joining
;; the kernel already running for the home (through its connection file,
;; found as opencortex-kernel.el says), or else starting the kernel process (the secret goes in its environment,
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
(require 'opencortex-kernel)
(require 'opencortex-chat)
(require 'opencortex-stream)
(require 'opencortex-approval)
(require 'opencortex-tools)
(require 'opencortex-tools-org)

(declare-function opencortex--lost "opencortex-recovery" (conn why))

;;;; Options

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

;;;; Stopping

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
