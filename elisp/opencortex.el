;;; opencortex.el --- Chat with the opencortex kernel from Emacs  -*- lexical-binding: t; coding: utf-8 -*-

;; Version: 0.1.0
;; Package-Requires: ((emacs "27.1") (epc "0.1.1"))
;; Keywords: tools, convenience
;; License: GPL-3.0-or-later

;;; Commentary:

;; M-x opencortex-chat starts the opencortex kernel (`opencortex serve'),
;; connects to it over EPC and opens the *opencortex-chat* buffer.  Type below
;; the prompt and press C-c RET; the reply streams in as an org subtree.
;;
;; Files: opencortex-connection.el (the kernel process and the EPC
;; connection), opencortex-chat.el (the buffer, output, header line),
;; opencortex-stream.el (turns and streamed replies), opencortex-approval.el
;; (approving what the kernel wants to run).  This file holds the commands,
;; connection files, and `opencortex-wait-idle' for tests and scripts.

;;; Code:

(require 'json)
(require 'subr-x)

(defgroup opencortex nil
  "Chat with LLM-driven skills through the opencortex kernel."
  :group 'tools
  :prefix "opencortex-")

(require 'opencortex-connection)

(defcustom opencortex-connection-file nil
  "Connection file of a kernel started on its own, read by `opencortex-connect'.
nil means $XDG_RUNTIME_DIR/opencortex/kernel.json, or
/tmp/opencortex-UID/kernel.json without XDG_RUNTIME_DIR."
  :type '(choice (const :tag "Default" nil) file))

(defcustom opencortex-wait-timeout 30
  "Default bound in seconds of `opencortex-wait-idle' and `opencortex-wait-for'."
  :type 'number)

;;;; Connection files

(defun opencortex--read-connection-file (file)
  "The port and secret in the connection FILE, as (PORT . SECRET)."
  (unless (file-readable-p file)
    (user-error "No kernel connection file %s: start one with `opencortex serve', or use M-x opencortex-chat"
                file))
  (unless (zerop (logand (file-modes file) #o077))
    (user-error "The connection file %s is readable by others; refusing it (chmod 600)" file))
  (let* ((json-object-type 'alist)
         (data (json-read-file file))
         (port (alist-get 'port data))
         (secret (alist-get 'secret data)))
    (unless (and (integerp port) (stringp secret))
      (user-error "The connection file %s has no port and secret" file))
    (cons port secret)))

(defun opencortex--default-connection-file ()
  "Where a kernel started on its own writes its connection file."
  (or opencortex-connection-file
      (let ((runtime (getenv "XDG_RUNTIME_DIR")))
        (if (and runtime (not (string-empty-p runtime)))
            (expand-file-name "opencortex/kernel.json" runtime)
          (format "/tmp/opencortex-%d/kernel.json" (user-uid))))))

;;;; Waiting (for tests and scripts)

(defun opencortex--busy-p ()
  "Whether anything is under way: starting, calls unanswered, turns, pending text."
  (let ((conn opencortex--connection))
    (or (timerp opencortex--restart-timer)
        (and conn (memq (opencortex--connection-state conn) '(starting authenticating)))
        (and conn (> (hash-table-count (opencortex--connection-pending conn)) 0))
        (opencortex--turns-busy-p))))

(defun opencortex-wait-for (predicate &optional timeout)
  "Process kernel output until PREDICATE returns non-nil; return its value.
Give up after TIMEOUT seconds (default `opencortex-wait-timeout') and
return nil."
  (let ((deadline (+ (float-time) (or timeout opencortex-wait-timeout)))
        value)
    ;; Short slices: a reply's deferred callback runs from a timer, so a
    ;; long slice would add its length to every round trip.
    (while (and (not (setq value (funcall predicate)))
                (< (float-time) deadline))
      (accept-process-output nil 0.001))
    value))

(defun opencortex-wait-idle (&optional timeout)
  "Wait until nothing is under way: no turn in flight, no call unanswered.
Return t when idle, nil when TIMEOUT seconds (default
`opencortex-wait-timeout') passed first."
  (and (opencortex-wait-for (lambda () (not (opencortex--busy-p))) timeout) t))

(defun opencortex-kernel-process ()
  "The kernel process Emacs started, or nil."
  (let ((conn opencortex--connection))
    (and conn (opencortex--connection-process conn))))

;;;; Commands

;;;###autoload
(defun opencortex-chat ()
  "Open the chat buffer, starting the kernel when it is not running."
  (interactive)
  (let ((buffer (opencortex--chat-buffer)))
    (unless (opencortex--live-p opencortex--connection)
      (opencortex--start-kernel))
    (pop-to-buffer-same-window buffer)
    buffer))

;;;###autoload
(defun opencortex-connect (&optional file)
  "Connect to a kernel started on its own, through its connection FILE.
FILE defaults to `opencortex-connection-file' or the runtime directory."
  (interactive)
  (let* ((file (or file (opencortex--default-connection-file)))
         (port-and-secret (opencortex--read-connection-file file))
         (conn (opencortex--make-connection :secret (cdr port-and-secret))))
    (when (opencortex--live-p opencortex--connection)
      (opencortex--shutdown opencortex--connection))
    (setq opencortex--connection conn)
    (opencortex--set-state conn 'starting)
    (add-hook 'kill-emacs-hook #'opencortex--stop-on-exit)
    (opencortex--attach conn (car port-and-secret))
    (when (called-interactively-p 'any)
      (pop-to-buffer-same-window (opencortex--chat-buffer)))
    conn))

(defun opencortex-stop ()
  "Stop the kernel Emacs started (or disconnect from one it connected to)."
  (interactive)
  (when (timerp opencortex--restart-timer)
    (cancel-timer opencortex--restart-timer)
    (setq opencortex--restart-timer nil))
  (setq opencortex--auto-restarts 0)
  (when (opencortex--live-p opencortex--connection)
    (opencortex--shutdown opencortex--connection)
    (message "opencortex: kernel stopped")))

(defun opencortex-restart ()
  "Stop the kernel and start a new one."
  (interactive)
  (opencortex-stop)
  (opencortex--start-kernel))

(defun opencortex-send (&optional text)
  "Send TEXT, by default the input area, to the kernel.
A text starting with / is a slash command; anything else a message."
  (interactive)
  (let* ((from-input (null text))
         (text (string-trim (or text (opencortex--take-input)))))
    (cond
     ((string-empty-p text)
      (user-error "Nothing to send: type below the prompt, then C-c RET"))
     ((string-prefix-p "/" text)
      (opencortex--request
       'slash-command (list opencortex-chat-id text)
       (lambda (reply)
         (opencortex--output (format "* %s\n%s" text
                                     (opencortex--ensure-newline
                                      (or (plist-get reply :text) "")))
                             nil 'slash)
         (opencortex--refresh-status))
       (lambda (message)
         (opencortex--show-error (format "The command %s failed: %s" text message))
         (when from-input (opencortex--restore-input text)))))
     (t
      (opencortex--output (format "* You\n%s\n" text) nil 'you)
      (opencortex--request
       'send-message (list opencortex-chat-id text)
       (lambda (reply)
         (setq opencortex--thread (plist-get reply :thread))
         (opencortex--turn-started (plist-get reply :turn-id)))
       (lambda (message)
         (opencortex--show-error
          (format "Your message was not sent: %s.%s" message
                  (if from-input " It is back in the input area: C-c RET tries again." "")))
         (when from-input (opencortex--restore-input text))))))))

(defun opencortex-abort ()
  "Abort the turn in progress."
  (interactive)
  (opencortex--request 'abort-turn (list opencortex-chat-id)
                       (lambda (running)
                         (message (if running "opencortex: aborting the turn"
                                    "opencortex: no turn is running")))))

(defun opencortex-reload-skills ()
  "Reload the kernel's skills from disk and report broken ones."
  (interactive)
  (opencortex--request
   'reload-skills nil
   (lambda (reply)
     (let ((errors (plist-get reply :errors)))
       (message "opencortex: %s skills loaded" (plist-get reply :skills))
       (when errors
         (opencortex--show-error (concat "Some skills did not load:\n"
                                         (mapconcat #'identity errors "\n"))))))))

(defun opencortex-open-memory ()
  "Open the org file where the kernel archives this chat's thread."
  (interactive)
  (opencortex--request
   'status (list opencortex-chat-id)
   (lambda (status)
     (opencortex--set-status status)
     (let ((file (plist-get status :memory-file)))
       (if (and (stringp file) (not (string-empty-p file)))
           (find-file file)
         (message "opencortex: the kernel named no memory file"))))))

(provide 'opencortex)
;;; opencortex.el ends here
