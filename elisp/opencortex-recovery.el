;;; opencortex-recovery.el --- A lost kernel: said, restarted, reconnected or joined  -*- lexical-binding: t; -*-

;; This file is part of opencortex.
;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; What happens when the kernel of the one connection (opencortex-connection.el)
;; dies, cannot start or stops answering: `opencortex--lost' says so in the
;; chat buffer with the kernel's last log lines, and then restarts a kernel
;; Emacs started (`opencortex-auto-restart-limit' times without asking), offers
;; to connect again to one it did not start, or, when a start was refused
;; because a kernel already runs for the home, joins that kernel instead.

;;; Code:

(require 'cl-lib)
(require 'subr-x)
(require 'opencortex-kernel)
(require 'opencortex-connection)

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

(provide 'opencortex-recovery)
;;; opencortex-recovery.el ends here
